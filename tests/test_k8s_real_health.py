"""A hung rank in a Kubernetes job on REAL pods (the node of scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1).

Rank 1's forward pass stops returning after 20 steps (tests/ailing_rank.py's stall: the process lives, its watchdog
thread too) in the first attempt only. What is real: the watchdog's exit (142) ending both containers, the kubelet
restarting them in place (restartPolicy OnFailure, within the backoffLimit that --max-restarts sets), the restarted
processes resuming from the newest checkpoint by themselves (HPCTRAIN_AUTO_RESUME), and the termination message the
kubelet keeps as the container's last state, which `hpctrain status` shows. Still a stand-in: the PyTorchJob
controller (tests/kubeflow_standin.py, controllers only), as in tests/test_k8s_real_jobs.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.base import SUCCEEDED
from real_node import DEADLINE_S, Real, real  # noqa: F401 - the fixture: the whole node (2 pods of 1 CPU)
from test_k8s_real_jobs import finished
from test_preemption_slurm import _RESUMED, TRAIN
from training_helpers import assert_bitwise_equal, clean_environ, final_weights, ok

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

TESTS = Path(__file__).parent


def test_a_hung_rank_is_named_and_the_restarted_pods_resume_exactly(
    real: Real, tmp_path: Path, fashion_data_dir: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    run_dir = shared / "run"
    train = (
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(fashion_data_dir),
        "--epochs",
        "1",
        "--run-dir",
        str(run_dir),
        "--checkpoint-every",
        "16",
    )
    job = JobSpec(
        command=("python", str(TESTS / "ailing_rank.py"), *train, "--hang-timeout", "5"),
        name="hung",
        run_dir=str(run_dir),
        max_restarts=2,
        resources=Resources(nodes=2, cpus_per_task=1, mem="2G"),
        env=(
            ("HPCTRAIN_TEST_AILING_RANK", "1"),
            ("HPCTRAIN_TEST_AILING", "stall"),
            ("HPCTRAIN_TEST_AILING_S", "20"),
            ("HPCTRAIN_TEST_AILING_ONCE", "1"),
            ("HPCTRAIN_TEST_AILING_MARKER", str(shared / "ailed")),
        ),
    )
    sched = real.scheduler(
        f"host:{fashion_data_dir}:{fashion_data_dir}:ro", f"host:{shared}:{shared}", f"host:{TESTS}:{TESTS}:ro"
    )
    sched.submit(job, sched.render(job))
    status = real.wait("the job to finish", lambda: finished(sched, "hung"))
    log = "\n".join(sched.logs("hung"))
    shown = real.cli("status", "hung", *real.where)
    assert status.state == SUCCEEDED, (status, log, shown.stdout)

    report = (run_dir / "hang" / "report.txt").read_text()
    culprit = re.search(r"culprit: rank 1 on (\S+) never arrived in ", report)
    assert culprit and culprit.group(1) in real.nodes, report  # the Kubernetes node, not the pod's host name
    assert [r.restarts for r in status.replicas] == [1, 1], status
    said = [r.message or "" for r in status.replicas]
    assert all(m.startswith("hung at step ") and f"rank 1 on {culprit.group(1)} never arrived" in m for m in said), said
    assert shown.returncode == 0 and "ended: master-0, worker-0: hung at step " in shown.stdout, shown.stdout
    resumed = _RESUMED.search(log)
    assert resumed and int(resumed.group(4)) == 16, log  # the newest checkpoint before the stall (step 20)
    assert (run_dir / "stop_reason").read_text().strip() == "completed"

    reference = tmp_path / "reference"
    plain = [a if a != str(run_dir) else str(reference) for a in train]
    ok(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                "-m",
                "hpctrain",
                *plain,
            ],
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    )
    assert_bitwise_equal(final_weights(run_dir), final_weights(reference))
