"""`hpctrain dev save NAME IMAGE`: a dev session's environment saved as a new image.

Real here: the local Slurm cluster (the session's job is a real running job, and the save step is a real `srun
--jobid JOB --overlap` step in it), the real kube-apiserver (the build's ConfigMap and Job are created there and
checked by its validation), the CLI in a subprocess.

STAND-INS, because the tools cannot run on this machine (no pyxis plugin in its Slurm, no apptainer, no image
builder, no registry):
- `srun` for a pyxis save: a script first on PATH that applies pyxis's own rules for the flags it adds to srun
  (NVIDIA/pyxis args.c: --container-name NAME[:auto|create|exec|no_exec], non-empty; --container-save PATH, non-empty,
  not ending in `/`, "target is a directory"; each given once), then runs the REAL srun without them, whose step
  writes what enroot's export writes (a squashfs file: `hsqs` magic) to the --container-save path.
- `apptainer`: a script on PATH (the job step finds it: srun passes PATH on) that applies `apptainer build`'s rules
  (apptainer docs, "Build a container": TARGET must not exist without --force; a directory SOURCE is a sandbox;
  the output is a SIF file, `SIF_MAGIC` after its 32-byte launch line) and writes such a file.
- BuildKit: its Job is created on the real API server but no pod runs it (no kubelet there); what it would push is
  not tested here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.errors import UserError
from hpctrain.images import image_format
from hpctrain.schedulers.service_api import Placement
from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec
from hpctrain.schedulers.slurm.services.service_jobs import render_dev_script
from hpctrain.servers.sessions import SAVE_ADVICE, DevConfig
from hpctrain.schedulers.slurm.services import dev_save as slurm_save
from hpctrain.schedulers.kubernetes.services import image_build

SRUN_PYXIS = r"""#!/usr/bin/env python3
# STAND-IN for pyxis inside srun (see the test module's docstring): pyxis's flag rules, then the real srun.
import os, shutil, sys
args, rest, pyxis = sys.argv[1:], [], {}
while args:
    a = args.pop(0)
    if a.startswith("--container-"):
        key, _, value = a.partition("=")
        if key in pyxis:
            sys.exit(f"pyxis: {key} specified multiple times")
        pyxis[key] = value
    else:
        rest.append(a)
name = pyxis.get("--container-name")
if name is not None:
    base, _, flags = name.partition(":")
    if not base:
        sys.exit("pyxis: --container-name: empty name")
    if flags and flags not in ("auto", "create", "exec", "no_exec"):
        sys.exit('pyxis: --container-name: flag must be "auto", "create", "exec" or "no_exec"')
save = pyxis.get("--container-save")
if save is not None:
    if not save:
        sys.exit("pyxis: --container-save: argument required")
    if save.endswith("/"):
        sys.exit("pyxis: --container-save: target is a directory")
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
here = os.path.dirname(os.path.abspath(__file__))
path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if os.path.abspath(d) != here)
real = shutil.which("srun", path=path)
if save is not None:  # the container's export, in the step: a squashfs file
    rest = rest[: rest.index("true")] + ["sh", "-c", 'printf "hsqs-standin" > "$1"', "sh", save]
os.execv(real, [real, *rest])
"""

APPTAINER = r"""#!/usr/bin/env python3
# STAND-IN for `apptainer build TARGET SOURCE` (see the test module's docstring).
import os, sys
args = sys.argv[1:]
if args[:1] != ["build"]:
    sys.exit("stand-in: only `apptainer build`")
force = "--force" in args
target, source = [a for a in args[1:] if not a.startswith("-")]
if os.path.exists(target) and not force:
    sys.exit(f"FATAL: While checking build target: build target '{target}' already exists. Use --force")
if not os.path.isdir(source):
    sys.exit(f"FATAL: stand-in knows sandbox directories only: {source}")
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
with open(target, "wb") as out:
    out.write(b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC" + b"\0" * 64)
"""


def standin(bin_dir: Path, name: str, text: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(text.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    path.chmod(0o755)


def record_session(home: Path, name: str, job_id: str, environment: EnvironmentSpec) -> Path:
    """A session's record as `dev start` writes it, for a job that really runs (no pyxis or apptainer here)."""
    state = home / "dev" / name
    state.mkdir(parents=True, mode=0o700)
    conn = {"name": name, "scheduler": "slurm", "service": "jupyter", "job_id": job_id}
    conn["environment"] = slurm_save.record(environment)
    (state / "connection.json").write_text(json.dumps(conn))
    return state


def test_a_pyxis_session_names_its_container_for_save(tmp_path: Path) -> None:
    """pyxis reads PYXIS_CONTAINER_NAME as --container-name (args.c): the session's step runs in the container
    that `dev save`'s step names; other environments get no such line."""
    nb = DevConfig("nb")
    script = render_dev_script(nb, tmp_path, Placement(image="/images/torch.sqsh"))
    assert "export PYXIS_CONTAINER_NAME=hpctrain-dev-nb\n" in script
    assert script.index("PYXIS_CONTAINER_NAME") < script.index("srun ")
    chosen = slurm_save.plan("nb", {"job_id": "7", "environment": {"kind": "pyxis"}}, str(tmp_path / "new.sqsh"))
    assert "--container-name=hpctrain-dev-nb" in chosen.argv and "--jobid=7" in chosen.argv
    assert "PYXIS" not in render_dev_script(DevConfig("nb"), tmp_path)
    assert "export APPTAINER_WRITABLE=true\n" in render_dev_script(nb, tmp_path, Placement(image="/images/torch/"))
    assert "WRITABLE" not in render_dev_script(nb, tmp_path, Placement(image="/images/torch.sif"))


@pytest.mark.parametrize(
    ("image", "error"),
    [
        ("out/", "names a directory: give a file"),
        ("new.sif", "must end in .sqsh here"),
        ("missing/new.sqsh", "no folder .*missing: create it first"),
        ("exists.sqsh", "exists: choose another name, or remove it first"),
        ("a,b.sqsh", "without commas"),
    ],
)
def test_bad_image_files_are_refused_with_the_fix(tmp_path: Path, image: str, error: str, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists.sqsh").write_bytes(b"hsqs")
    with pytest.raises(UserError, match=error):
        slurm_save.plan("nb", {"job_id": "7", "environment": {"kind": "pyxis"}}, image)


def test_environments_that_cannot_be_saved_get_the_steps(tmp_path: Path) -> None:
    conn = {"job_id": "7", "environment": slurm_save.record(EnvironmentSpec(kind="venv", venv="/nas/venvs/t"))}
    outcome = slurm_save.save("nb", conn, "x.sqsh", dry_run=False)
    assert outcome.kind == "steps" and "/nas/venvs/t" in outcome.lines[0] and "pip freeze" in outcome.lines[1]
    assert outcome.lines[-1] == SAVE_ADVICE
    sif = {"job_id": "7", "environment": slurm_save.record(EnvironmentSpec(kind="apptainer", image="/i/t.sif"))}
    steps = slurm_save.save("nb", sif, "/i/new.sif", dry_run=False).lines
    assert "  apptainer build --sandbox /i/t-sandbox/ /i/t.sif" in steps
    assert "  apptainer build /i/new.sif /i/t-sandbox/" in steps


@pytest.mark.slurm
@pytest.mark.parametrize("kind", ["pyxis", "apptainer"])
def test_a_running_session_is_saved_by_a_step_beside_it(slurm_cluster, tmp_path: Path, kind: str) -> None:
    home, bin_dir, log = tmp_path / "home", tmp_path / "bin", tmp_path / "standin.log"
    standin(bin_dir, "srun" if kind == "pyxis" else "apptainer", SRUN_PYXIS if kind == "pyxis" else APPTAINER)
    env = cli_env(home, path_prefix=bin_dir, STANDIN_LOG=str(log))
    source = "/images/torch.sqsh" if kind == "pyxis" else f"{tmp_path}/sandbox/"
    (tmp_path / "sandbox").mkdir()
    image = tmp_path / "images" / ("explore.sqsh" if kind == "pyxis" else "explore.sif")
    image.parent.mkdir()
    job_id = slurm_cluster.sbatch("--wrap", "sleep 300", "--output", "/dev/null", "--cpus-per-task=1", cwd=tmp_path)
    try:
        state = record_session(home, "nb", "999999999", EnvironmentSpec(kind=kind, image=source))
        gone = hpctrain("dev", "save", "nb", str(image), env=env)  # a session whose job has ended
        assert gone.returncode == 2 and "is gone, and a session is saved while it runs" in gone.stderr, gone.stderr
        assert not image.exists() and not log.exists()
        (state / "connection.json").unlink()
        state.rmdir()
        record_session(home, "nb", job_id, EnvironmentSpec(kind=kind, image=source))
        slurm_cluster.wait_state(job_id, {"RUNNING"})
        dry = hpctrain("dev", "save", "nb", str(image), "--dry-run", env=env)
        assert dry.returncode == 0 and f"srun --jobid={job_id} --overlap" in dry.stdout, dry.stdout + dry.stderr
        assert not image.exists() and not log.exists()
        saved = hpctrain("dev", "save", "nb", str(image), env=env)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        assert f"saved dev session nb as {image}" in saved.stdout and SAVE_ADVICE in saved.stdout
        assert image_format(image) == ("sqsh" if kind == "pyxis" else "sif")
        assert not list(image.parent.glob(".*partial*")), "the temporary was renamed"
        ran = log.read_text()
        if kind == "pyxis":
            assert f"--container-name=hpctrain-dev-nb --container-save={image.parent}/.explore.sqsh.partial" in ran
        else:
            assert f"build {image.parent}/.explore.sif.partial {source}" in ran
        again = hpctrain("dev", "save", "nb", str(image), env=env)
        assert again.returncode == 2 and "exists: choose another name" in again.stderr
        assert "Traceback" not in again.stderr and len(again.stderr.strip().splitlines()) == 1
    finally:
        slurm_cluster.cancel_quietly(job_id)


def test_save_of_an_unknown_session_is_one_line(tmp_path: Path) -> None:
    result = hpctrain("dev", "save", "nope", "x.sqsh", env=cli_env(tmp_path / "home"))
    assert result.returncode == 2 and result.stderr.strip().endswith(
        "no dev session named 'nope': see `hpctrain dev list`"
    )
    assert len(result.stderr.strip().splitlines()) == 1


# ---- Kubernetes ----------------------------------------------------------------------------------------------------


def test_the_packages_installed_in_the_session_are_those_new_since_it_started() -> None:
    base = "numpy==1.26.4\ntorch==2.3.0\n"
    now = "numpy==2.0.1\ntorch==2.3.0\neinops==0.8.0\n-e /home/me/proj\nmine @ file:///home/me/mine\n"
    assert image_build.packages_added(base, now) == (
        ["numpy==2.0.1", "einops==0.8.0"],
        ["-e /home/me/proj", "mine @ file:///home/me/mine"],
    )


@pytest.mark.parametrize("bad", ["Me/Explore:1", "reg.example.org/x@sha256:" + "a" * 64, "x:", "", "reg#x"])
def test_bad_image_names_are_refused_with_the_fix(bad: str) -> None:
    with pytest.raises(UserError, match="use REGISTRY/NAME:TAG with a lower-case name"):
        image_build.check_image(bad)
    assert image_build.check_image("docker://reg.example.org:5000/me/explore:1") == "reg.example.org:5000/me/explore:1"


def test_the_pod_records_its_image_packages_before_jupyterlab_starts() -> None:
    from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
    from hpctrain.schedulers.kubernetes.services.service_pods import render_dev_pod

    pod = render_dev_pod(DevConfig("nb"), KubernetesOptions(namespace="t", image="img"))
    script = pod["spec"]["containers"][0]["command"][2]
    assert script.startswith(f"python3 -m pip freeze > {image_build.BASE_PACKAGES} ") and "exec jupyter lab" in script


@pytest.mark.k8s
def test_the_build_job_is_accepted_by_the_api_server_and_owns_its_config_map(k8s_cluster) -> None:
    from kubernetes import client

    from hpctrain.schedulers.kubernetes.api.client import translating
    from kubeflow_standin import create_namespace, delete_namespace

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core, batch = translating(client.CoreV1Api(api)), translating(client.BatchV1Api(api))
    try:
        config_map, job = image_build.render_build(
            "nb", namespace, "base:1", "reg.example.org/me/nb:1", ["einops==0.8"]
        )
        assert "FROM base:1\n" in config_map["data"]["Dockerfile"]
        assert config_map["data"]["requirements.txt"] == "einops==0.8\n"
        image_build.create(core, batch, namespace, config_map, job)
        made = batch.read_namespaced_job("dev-nb-save", namespace)
        assert made.spec.template.spec.containers[0].args[-1] == "type=image,name=reg.example.org/me/nb:1,push=true"
        owners = core.read_namespaced_config_map("dev-nb-save", namespace).metadata.owner_references
        assert [(o.kind, o.name, o.uid) for o in owners] == [("Job", "dev-nb-save", made.metadata.uid)]
        with pytest.raises(UserError, match="a build dev-nb-save already exists .*: wait for it, or delete it"):
            image_build.create(core, batch, namespace, config_map, job)
        assert batch.read_namespaced_job("dev-nb-save", namespace).metadata.uid == made.metadata.uid
    finally:
        delete_namespace(api, namespace)


def test_the_cli_prints_the_steps_where_the_session_cannot_be_saved(tmp_path: Path) -> None:
    home = tmp_path / "home"
    record_session(home, "nb", "999999999", EnvironmentSpec(kind="venv", venv="/nas/venvs/torch"))
    result = hpctrain("dev", "save", "nb", str(tmp_path / "nb.sqsh"), env=cli_env(home))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dev session nb is not saved as an image; what to do instead:"
    assert "/nas/venvs/torch" in lines[1] and lines[-1] == SAVE_ADVICE
    assert not (tmp_path / "nb.sqsh").exists()
