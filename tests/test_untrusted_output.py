"""What hpctrain prints of text it does not control (job and node names, paths, records read back) is printed as
that text: never as rich markup, never as an unquoted word of a paste-ready command, never with a URL's password.

The Slurm cases run against the real local cluster (its job names are anyone's); TensorBoard and `image list` run
for real here; the rest are pure functions fed hostile text.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.cli.views import show
from hpctrain.schedulers.slurm.queries.display import cluster_view
from hpctrain.schedulers.slurm.queries.cluster_state import ClusterInfo, NodeInfo, PartitionInfo
from training_helpers import run_hpctrain

HOSTILE_NAMES = ("exp[bs=64]", "[/data/x]", "[bold red]loud[/]", "a[/]b", "[link=http://x]y")


def hpctrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, timeout=120)


@pytest.mark.slurm
def test_status_prints_job_names_as_they_are(slurm_cluster, tmp_path: Path) -> None:
    jobs = [
        slurm_cluster.sbatch("-J", name, "--hold", "-o", "/dev/null", "--wrap", "true", cwd=tmp_path)
        for name in HOSTILE_NAMES
    ]
    try:
        for listing in (hpctrain("status"), hpctrain("status", "--all-users")):
            assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing
            for name in HOSTILE_NAMES:
                assert name in listing.stdout, listing.stdout
        for job, name in zip(jobs, HOSTILE_NAMES):
            one = hpctrain("status", job)
            assert one.returncode == 0 and "Traceback" not in one.stderr, one
            assert name in one.stdout, one.stdout
    finally:
        for job in jobs:
            slurm_cluster.cancel_quietly(job)


def test_cluster_prints_node_and_partition_names_as_they_are(capsys) -> None:
    nodes = tuple(
        NodeInfo(
            name=name,
            state="idle",
            partitions=(f"p{name}",),
            cpus_total=4,
            cpus_alloc=0,
            mem_mb_total=1024,
            mem_mb_alloc=0,
            gpu_type=f"t{name}",
            gpus_total=1,
            gpus_used=0,
            shards_total=0,
            shards_used=None,
            shards_per_gpu=None,
        )
        for name in HOSTILE_NAMES
    )
    parts = tuple(
        PartitionInfo(name=f"p{name}", state="up", default=False, max_time_s=None, nodes=(name,))
        for name in HOSTILE_NAMES
    )
    show(cluster_view(ClusterInfo(partitions=parts, nodes=nodes)), as_json=False)
    out = capsys.readouterr().out
    for name in HOSTILE_NAMES:
        assert name in out and f"p{name}" in out, out


HOSTILE_NODE = "$(touch pwned)"


def _pasted(line: str) -> list[str]:
    """The words a shell gives the suggested command between backquotes in `line` when it is pasted."""
    command = line.split("`")[1]
    return shlex.split(command)


def test_a_sick_node_named_by_a_pod_reaches_the_suggested_command_only_as_a_node_name() -> None:
    from hpctrain.schedulers.base import JobStatus, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import ended_lines

    said = (f"sick_node: gpu07,{HOSTILE_NODE}", "sick_node: node[1-2]", "sick_node: a b;c", "sick_node: n1\nrm -rf x")
    status = JobStatus(
        job_id="j",
        state="FAILED",
        replicas=tuple(
            ReplicaStatus(name=f"worker-{i}", phase="Failed", exit_code=144, message=m) for i, m in enumerate(said)
        ),
    )
    lines = ended_lines(status)
    [suggestion] = [line for line in lines if line.startswith("sick node(s)")]
    assert _pasted(suggestion) == ["hpctrain", "submit", "--exclude-nodes", "gpu07,n1", "..."]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 3 and any(repr(HOSTILE_NODE) in w for w in warnings), lines


def test_a_bad_nodes_file_reaches_the_trainings_suggestion_only_as_node_names(tmp_path: Path, caplog) -> None:
    from types import SimpleNamespace

    from hpctrain.training.loop import RunResult, _report_end
    from hpctrain.training.run import Run
    from hpctrain.training.stopping import StopReason

    (tmp_path / "bad_nodes").write_text(f"node07\n{HOSTILE_NODE}\n`id`\n")
    run = SimpleNamespace(is_main=True, run_dir=tmp_path, say=print, cfg=SimpleNamespace(preflight_only=False))
    run.warn, run.error = (functools.partial(channel, run) for channel in (Run.warn, Run.error))  # Run's own
    with caplog.at_level(logging.INFO, logger="hpctrain"):  # Run.error speaks through the log channel
        _report_end(run, RunResult(tmp_path, 0, 0, StopReason.SICK_NODE))
    err = "\n".join(record.getMessage() for record in caplog.records)
    assert "touch" not in err and "`id`" not in err, err
    assert _pasted(err.split("elsewhere submit it again away from them: ")[1]) == [
        "hpctrain",
        "submit",
        "--exclude-nodes",
        "node07",
        "...",
    ]


def test_submits_suggested_command_quotes_the_users_words(capsys) -> None:
    from hpctrain.cli import main

    assert main(["submit", "--dry-run", "python3", "train.py", "--note", "$(touch pwned); a b"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert _pasted(err.split("put your own command after `--` (")[1]) == [
        "hpctrain",
        "submit",
        "[options]",
        "--",
        "python3",
        "train.py",
        "--note",
        "$(touch pwned); a b",
    ]


def _served_runs(argv: list[str], env: dict[str, str], cwd: Path, port: int) -> set[str]:
    """Start a TensorBoard command line, wait (bounded) until it answers, and return the runs it serves."""
    from hpctrain.servers.common import http_get

    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (answer := http_get(f"http://127.0.0.1:{port}/data/runs"))[0] != 200 or not json.loads(answer[1]):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "TensorBoard never answered"
            time.sleep(0.5)
        return set(json.loads(answer[1]))
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_run_directory_named_like_an_option_reaches_tensorboard_as_a_folder(tmp_path: Path) -> None:
    """`-x` here (the local server), and the command lines of the Slurm job and the pod, run here as they would
    run there: each serves the run `-x`, none takes it for an option."""
    from hpctrain.schedulers.kubernetes.services.service_pods import tensorboard_pod
    from hpctrain.schedulers.slurm.services.service_jobs import TENSORBOARD_COMMAND
    from hpctrain.distributed.ports import free_port
    from hpctrain.servers.tensorboard import logdir_spec, tensorboard_argv

    pytest.importorskip("tensorboard")
    from test_tensorboard import make_run

    run = make_run(tmp_path / "-x", [1.0])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    spec = logdir_spec([run])  # what `hpctrain tensorboard -- -x` makes of it: `-x:/.../-x/tb`
    assert spec.startswith("-x:")
    port = free_port()
    assert _served_runs(tensorboard_argv(spec, port), env, tmp_path, port) == {"-x/."}
    port = free_port()
    slurm_env = {**env, "HPCTRAIN_TB_SPEC": spec, "HPCTRAIN_PORT": str(port)}
    assert _served_runs(list(TENSORBOARD_COMMAND), slurm_env, tmp_path, port) == {"-x/."}
    pod = list(tensorboard_pod(spec, None).command)
    port = free_port()
    assert _served_runs([*pod[:-1], str(port)], env, tmp_path, port) == {"-x/."}  # the pod's port, here a free one


def test_image_list_shows_a_file_whose_time_is_no_date(tmp_path: Path) -> None:
    """tmpfs keeps any 64-bit time (ext4 clamps it to 2446): the file is made there."""
    import tempfile

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm (tmpfs) to keep an absurd file time")
    with tempfile.TemporaryDirectory(dir=shm) as folder:
        for name, mtime in (("far.sif", 10**13), ("past.sqsh", -(10**13)), ("now.sif", None)):
            (Path(folder) / name).write_bytes(b"x")
            if mtime is not None:
                os.utime(Path(folder) / name, (0, mtime))
        proc = hpctrain("image", "list", folder)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["far.sif", "now.sif", "past.sqsh"], proc.stdout
    assert "(no valid date)" in lines[0] and "(no valid date)" in lines[2] and "(no valid date)" not in lines[1]


def test_kubernetes_status_prints_what_the_server_said_as_it_is(capsys) -> None:
    """The API server's words (a condition's message, a pod's reason and termination message, an event) printed as
    plain text: Kubernetes' display writes no markup at all, so brackets stay."""
    from hpctrain.schedulers.base import JobStatus, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import job_view

    words = HOSTILE_NAMES
    status = JobStatus(
        job_id="job-1",
        state="FAILED",
        message=words[0],
        pending_reasons=(words[1],),
        replicas=(ReplicaStatus(name="worker-0", phase="Failed", node="n1", reason=words[2], message=words[3]),),
    )
    show(job_view(status), as_json=False)
    out = capsys.readouterr().out
    for word in words[:4]:
        assert word in out, out


def test_kubernetes_tables_show_a_control_character_escaped(capsys) -> None:
    """A pod's reason or node name from the server holding an escape sequence reaches the terminal escaped, as in
    Slurm's tables: both backends' tables go through one printer (hpctrain.cli.tables.plain_table) since the CLI
    prints them; Kubernetes' own column printer wrote the escape sequence as it was."""
    from hpctrain.schedulers.base import ClusterView, JobStatus, NodeView, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import cluster_view, job_view

    status = JobStatus(
        job_id="job-1",
        state="PENDING",
        replicas=(ReplicaStatus(name="worker-0", phase="Pending", node="n1\x1b]0;x\x07", reason="Back\x1b[2JOff"),),
    )
    show(job_view(status), as_json=False)
    show(cluster_view(ClusterView(nodes=(NodeView("n\x1b[31m1", 4, 0, 2**30, 0),))), as_json=False)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "n1\\x1b]0;x\\x07" in out and "Back\\x1b[2JOff" in out and "n\\x1b[31m1" in out, out


# The output boundary (hpctrain.safetext.for_terminal): what a terminal would obey, or what hides or reorders text,
# in a name from outside, and how it must show instead.
TERMINAL_ATTACKS = {
    "osc\x1b]52;c;cm0gLXJmIH4=\x07end": "osc\\x1b]52;c;cm0gLXJmIH4=\\x07end",  # OSC 52: writes the clipboard
    "sgr\x1b[31mred": "sgr\\x1b[31mred",  # SGR: recolours what follows
    "c1\x9b2Jcsi": "c1\\x9b2Jcsi",  # C1 CSI: clears the screen in one character
    "bidi\u202eevil": "bidi\\u202eevil",  # RIGHT-TO-LEFT OVERRIDE: the rest shows backwards
    "zero\u200bwidth": "zero\\u200bwidth",  # looks like "zerowidth"
}
SEPARATORS = {  # each ends a line for some reader: the terminal, Python's splitlines, a log viewer
    "ls\u2028sep": "ls\\u2028sep",
    "ps\u2029sep": "ps\\u2029sep",
    "nel\x85x": "nel\\x85x",
}
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u200b", "\u2028", "\u2029", "\x85")


def _shows_escaped(text: str, names: dict[str, str]) -> None:
    for raw in RAW:
        assert raw not in text, (raw, text)
    for shown in names.values():
        assert shown in text, (shown, text)


def _status_shows_escaped(slurm_cluster, tmp_path: Path, names: dict[str, str]) -> None:
    jobs = [
        slurm_cluster.sbatch("-J", name, "--hold", "-o", "/dev/null", "--wrap", "true", cwd=tmp_path) for name in names
    ]
    try:
        for listing in (hpctrain("status"), hpctrain("status", "--all-users")):
            assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing
            _shows_escaped(listing.stdout, names)
        for job, (name, shown) in zip(jobs, names.items()):
            one = hpctrain("status", job)
            assert one.returncode == 0 and "Traceback" not in one.stderr, one
            _shows_escaped(one.stdout, {name: shown})
            assert "PENDING" in one.stdout, one.stdout
    finally:
        for job in jobs:
            slurm_cluster.cancel_quietly(job)


@pytest.mark.slurm
def test_status_shows_escape_sequences_and_bidi_controls_in_job_names_escaped(slurm_cluster, tmp_path: Path) -> None:
    """Real jobs on the local cluster, named to attack whoever lists them: `status`, `status --all-users` and
    `status JOB` (rich tables, then the detail lines) show each name's escapes, never the raw characters (rich's Text
    keeps ESC and C1 controls as they are)."""
    _status_shows_escaped(slurm_cluster, tmp_path, TERMINAL_ATTACKS)


@pytest.mark.slurm
def test_status_shows_line_separators_in_job_names_escaped(slurm_cluster, tmp_path: Path) -> None:
    """A line or paragraph separator (U+2028, U+2029) or NEL in a job name: the job shows as one row under its own
    name, escaped (this needs the Slurm output read as structure a name cannot split, issue 39 item 2)."""
    _status_shows_escaped(slurm_cluster, tmp_path, SEPARATORS)


@pytest.mark.slurm
def test_an_error_naming_what_the_user_gave_shows_it_escaped(slurm_cluster) -> None:
    """The CLI's one error line is at the boundary too: a partition asked for by a name holding an escape sequence."""
    name = next(iter(TERMINAL_ATTACKS))
    proc = hpctrain("cluster", "--partition", name)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    _shows_escaped(proc.stderr, {name: TERMINAL_ATTACKS[name]})


def _node(name: str) -> NodeInfo:
    return NodeInfo(
        name=name,
        state="idle",
        partitions=(f"p{name}",),
        cpus_total=4,
        cpus_alloc=0,
        mem_mb_total=1024,
        mem_mb_alloc=0,
        gpu_type=f"t{name}",
        gpus_total=1,
        gpus_used=0,
        shards_total=0,
        shards_used=None,
        shards_per_gpu=None,
    )


@pytest.mark.parametrize("filler", [0, 300], ids=["rich", "plain"])
def test_cluster_shows_hostile_node_partition_and_gpu_names_escaped(capsys, filler: int) -> None:
    """`cluster` on a short table (rich lays it out) and on one of more than RICH_ROWS rows (plain text): node,
    partition and GPU type names show escaped in both."""
    names = {**TERMINAL_ATTACKS, **SEPARATORS}
    hostile = [*names, *(f"node{i:04d}" for i in range(filler))]
    nodes = tuple(_node(name) for name in hostile)
    parts = tuple(
        PartitionInfo(name=f"p{name}", state="up", default=False, max_time_s=None, nodes=(name,)) for name in hostile
    )
    show(cluster_view(ClusterInfo(partitions=parts, nodes=nodes)), as_json=False)
    out = capsys.readouterr().out
    _shows_escaped(out, {**names, **{f"p{k}": f"p{v}" for k, v in names.items()}})
    assert all(f"t{shown}" in out for shown in names.values()), out  # the GPU type in the GPUs cell


def test_kubernetes_views_show_what_the_server_said_escaped(capsys) -> None:
    """Pod and node names, a replica type, reasons, a condition's message, scheduler events, termination messages,
    job names and quota lines from the API server: each shown escaped in `status`, `status JOB` and `cluster`."""
    from hpctrain.schedulers.base import ClusterView, JobStatus, JobSummary, NodeView, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import cluster_view, job_view, jobs_view

    names = {**TERMINAL_ATTACKS, **SEPARATORS}
    words = list(names)
    status = JobStatus(
        job_id="job-1",
        state="FAILED",
        exit_code=1,
        message=f"condition: {words[0]}",
        pending_reasons=tuple(f"event: {w}" for w in words),
        replicas=tuple(
            ReplicaStatus(
                name=f"{w}-0", phase="Failed", node=f"node-{w}", exit_code=1, reason=f"r-{w}", message=f"said {w}"
            )
            for w in words
        ),
    )
    show(job_view(status), as_json=False)
    show(jobs_view([JobSummary(job_id=f"j-{w}", state="RUNNING", created=w, replicas=2) for w in words], "ns"), False)
    nodes = ClusterView(nodes=tuple(NodeView(f"n-{w}", 4, 0, 2**30, 0) for w in words), quota=tuple(words))
    show(cluster_view(nodes), as_json=False)
    out = capsys.readouterr().out
    escaped = list(names.values())
    for prefix in ("condition: ", "event: ", "node-", "r-", "j-", "n-", "quota: "):
        assert all(f"{prefix}{e}" in out for e in (escaped[:1] if prefix == "condition: " else escaped)), prefix
    assert all(f"{e}-0" in out for e in escaped), out  # the replica's name: its type, from the job's spec
    # termination messages: cut at their first line (splitlines cuts at U+2028, U+2029 and NEL too)
    assert all(f"said {e}" in out for e in escaped[: len(TERMINAL_ATTACKS)]), out
    _shows_escaped(out, {})


def test_cancel_and_progress_lines_show_a_servers_words_escaped(capsys) -> None:
    """An Outcome's lines (`cancel`) and a backend's progress lines on stderr are at the boundary too."""
    from hpctrain.cli.views import progress_to_stderr, progress_to_stdout, tell
    from hpctrain.schedulers.base import Outcome

    names = {**TERMINAL_ATTACKS, **SEPARATORS}
    assert tell(Outcome(tuple(f"job {w}: deleted" for w in names), 1)) == 1
    for w in names:
        progress_to_stderr("cancel")(f"{w} still stopping")
        progress_to_stdout(f"state {w}")
    said = capsys.readouterr()
    _shows_escaped(said.out, names)
    _shows_escaped(said.err, names)


def test_image_list_shows_a_hostile_file_name_escaped(tmp_path: Path) -> None:
    """`image list` of a shared folder: a file named to attack shows escaped (a real folder, the real command)."""
    name = "osc\x1b]52;c;cm0gLXJmIH4=\x07\u202e.sif"
    (tmp_path / name).write_bytes(b"x")
    proc = hpctrain("image", "list", str(tmp_path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc
    assert "osc\\x1b]52;c;cm0gLXJmIH4=\\x07\\u202e.sif" in proc.stdout and "\x1b" not in proc.stdout, proc.stdout
