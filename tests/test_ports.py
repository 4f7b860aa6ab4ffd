"""The ports a job derives on a shared node (the batch script's torchrun rendezvous, srun's MASTER_PORT, a dev
session's server) come from one range, distributed/ports.py's, which ends below Linux's ephemeral range
(32768-60999 by default), walk-up included, and from one rule (job_port) and one walk. The scripts' port lines
are run by bash itself."""

from __future__ import annotations

import subprocess

from hpctrain.distributed.ports import EPHEMERAL_START, PORT_BASE, PORT_SPAN, PORT_TRIES, job_port
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.slurm.batch.script import render_sbatch
from hpctrain.schedulers.slurm.batch.options import SlurmOptions
from hpctrain.schedulers.slurm.services.service_jobs import port_lines


def bash_values(setup: str, line: str, runs: int, name: str) -> list[int]:
    """`line` (an assignment of $name) evaluated by bash `runs` times, after `setup` (the i-th run has $i)."""
    script = f'for i in $(seq 0 {runs - 1}); do {setup} {line}; echo "${name}"; done'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout
    return [int(v) for v in out.split()]


def test_the_range_and_its_walk_up_end_below_the_ephemeral_ports():
    assert 1024 <= PORT_BASE and PORT_BASE + PORT_SPAN - 1 + PORT_TRIES < EPHEMERAL_START == 32768


def test_the_batch_scripts_rendezvous_port_is_below_the_ephemeral_range():
    script = render_sbatch(JobSpec(command=("python", "train.py")), SlurmOptions(launcher="torchrun"))
    line = next(x for x in script.splitlines() if x.startswith("rdzv_port=$(("))
    # Job ids across more than a whole span: each maps into the range (20000 + id % 20000 reached 39999).
    ports = bash_values("SLURM_JOB_ID=$((i * 7 + 1));", line, 4000, "rdzv_port")
    assert min(ports) >= PORT_BASE and max(ports) < PORT_BASE + PORT_SPAN, (line, max(ports))


def _walk(lines: list[str], var: str) -> list[str]:
    """The lines from the start of the port walk to its `done`."""
    start = next(i for i, x in enumerate(lines) if x.startswith(f"{var}=$(("))
    return lines[start : lines.index("done", start) + 1]


def test_the_batch_script_and_a_service_job_derive_the_port_as_srun_does() -> None:
    """One rule: the batch script's rendezvous port and a service job's port are job_port(SLURM_JOB_ID), as srun's
    MASTER_PORT is (they were SLURM_JOB_ID % span and a random start); and one walk up past ports in use."""
    batch = _walk(
        render_sbatch(JobSpec(command=("python", "train.py")), SlurmOptions(launcher="torchrun")).splitlines(),
        "rdzv_port",
    )
    service = _walk(port_lines(None), "port")
    assert [x.replace("rdzv_port", "port") for x in batch[:-3]] == service[:-3]  # all but the failure's message
    ids = [1, 2, 7, 11999, 12000, 123457, 67_108_863]
    setup = "ids=(" + " ".join(map(str, ids)) + "); SLURM_JOB_ID=${ids[$i]};"
    assert bash_values(setup, batch[0], len(ids), "rdzv_port") == [job_port(i) for i in ids]
    assert bash_values(setup, service[0], len(ids), "port") == [job_port(i) for i in ids]


def test_srun_rendezvous_ports_stay_in_the_same_range():
    ports = {job_port(job, step) for job in range(0, 3 * PORT_SPAN, 7) for step in range(3)}
    assert min(ports) >= PORT_BASE and max(ports) < PORT_BASE + PORT_SPAN
