"""The launcher probes: each reads one launcher's variables into a `DistEnv` (and PROBES is their order), plus
the other answers those variables give: a node's plan of workers to start, a restart count, the derived port.

Order matters and follows the launchers' nesting: our own spawner and torchrun set RANK/LOCAL_RANK for each
worker even inside a Slurm allocation, so they are asked before Slurm; Slurm before the generic
RANK/WORLD_SIZE convention (Kubeflow PyTorchJob); a single process last. Every probe is a pure function of
the mapping it is given, so tests pass plain dicts instead of patching os.environ. `detect()`
(hpctrain.distributed.detect) asks them, or follows --dist-init-method.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Protocol

from hpctrain.distributed.environment import DistEnv, NodePlan, Vars
from hpctrain.distributed.hostlist import expand_tasks_per_node, first_host
from hpctrain.distributed.ports import job_port
from hpctrain.errors import UserError

__all__ = [
    "AUTO_RESUME_VAR",
    "PROBES",
    "RESTART_COUNT_VARS",
    "Probe",
    "kubeflow_node_plan",
    "may_be_a_restart",
    "restart_count",
    "slurm_node_plan",
    "slurm_port",
]

log = logging.getLogger(__name__)


# Set by Slurm on a requeued job and by torchrun on a restarted worker group: a later attempt of the same run.
RESTART_COUNT_VARS = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


class Probe(Protocol):
    name: str

    def detect(self, environ: Mapping[str, str]) -> DistEnv | None:
        """This launcher's view of the process, or None when the launcher did not start it."""


def _rendezvous(world_size: int) -> str | None:
    return "env://" if world_size > 1 else None


def torchrun_style(v: Vars, launcher: str) -> DistEnv:
    """RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK, as torchrun and our spawner set them."""
    why = "--dist-init-method env reads it" if launcher == "explicit" else f"{launcher} sets it for every worker"
    world_size = v.required_int("WORLD_SIZE", why=why, minimum=1)
    rank = v.required_int("RANK", why=why)
    local_rank = v.required_int("LOCAL_RANK", why=why)
    local_world_size = v.number("LOCAL_WORLD_SIZE", minimum=1)
    if local_world_size is None:
        if world_size > 1:
            raise UserError(
                "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not: set LOCAL_WORLD_SIZE to the number of processes "
                "on this node (torchrun sets both)"
            )
        local_world_size = 1
    node_rank = v.number("GROUP_RANK")
    if node_rank is None:
        node_rank = rank // local_world_size
    num_nodes = v.number("GROUP_WORLD_SIZE", minimum=1)
    if num_nodes is None:
        num_nodes = max(-(-world_size // local_world_size), node_rank + 1)
    return DistEnv(
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=v.text("MASTER_ADDR"),
        master_port=v.port("MASTER_PORT"),
        init_method=_rendezvous(world_size),
    )


class SpawnProbe:
    """Workers started by hpctrain's own local spawner (`hpctrain train --nproc N`, Kubeflow node plans)."""

    name = "spawn"

    def detect(self, environ: Mapping[str, str]) -> DistEnv | None:
        v = Vars(environ)
        marker = v.text("HPCTRAIN_LAUNCHER")
        if marker is None:
            return None
        if marker != "spawn":
            raise UserError(f"HPCTRAIN_LAUNCHER={marker!r} is not understood (only 'spawn'); unset it")
        return torchrun_style(v, "spawn")


class TorchrunProbe:
    """torchrun (also inside a Slurm allocation), or anything exporting torchrun's per-worker variables."""

    name = "torchrun"

    def detect(self, environ: Mapping[str, str]) -> DistEnv | None:
        v = Vars(environ)
        if not (v.has("TORCHELASTIC_RUN_ID") or v.has("LOCAL_RANK", "RANK", "WORLD_SIZE")):
            return None
        env = torchrun_style(v, "torchrun")
        _check_torchrun_under_srun(v)
        _check_exported_in_batch_script(v, env)
        return env


ELASTIC_MIN_NODES_VAR = "HPCTRAIN_ELASTIC_MIN_NODES"
"""Exported by the batch script of an elastic job (`--nodes MIN:MAX`): its torchrun agents, one per node, may form a
group of MIN nodes or more, fewer than the step's tasks once a node is lost."""
ELASTIC_MAX_NODES_VAR = "HPCTRAIN_ELASTIC_MAX_NODES"
"""... and its MAX, which the run records with MIN as the attempt's `requested_nodes` (shown by `status JOB`)."""


def _check_torchrun_under_srun(v: Vars) -> None:
    """srun -n4 torchrun --standalone ... makes four independent worlds that each train alone: refuse (an elastic
    job's group of fewer nodes than tasks, but at least its MIN, is one world that lost nodes)."""
    if not v.has("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID"):
        return
    agents = v.number("SLURM_STEP_NUM_TASKS") or v.number("SLURM_NTASKS")
    groups = v.number("GROUP_WORLD_SIZE")
    if agents is None or groups is None or groups >= agents:
        return
    low = v.number(ELASTIC_MIN_NODES_VAR, minimum=1)
    if low is not None and groups >= low:
        return
    raise UserError(
        f"srun started {agents} copies of torchrun (SLURM_STEP_NUM_TASKS={agents}) but torchrun formed a job of "
        f"{groups} node(s) (GROUP_WORLD_SIZE={groups}), so the copies would train as separate worlds. Start one "
        "torchrun per node (srun --ntasks-per-node=1) with --nnodes=$SLURM_NNODES --rdzv-backend=c10d "
        "--rdzv-endpoint=HEAD_NODE:29500 instead of --standalone, or drop torchrun and let srun start one task "
        "per GPU"
    )


def _check_exported_in_batch_script(v: Vars, env: DistEnv) -> None:
    """`export RANK=$SLURM_PROCID` in the batch script gives every srun task the batch shell's value (0)."""
    if v.has("TORCHELASTIC_RUN_ID") or not v.has("SLURM_STEP_ID", "SLURM_PROCID"):
        return
    tasks = v.number("SLURM_STEP_NUM_TASKS") or v.number("SLURM_NTASKS")
    procid = v.number("SLURM_PROCID")
    if tasks == env.world_size and procid != env.rank:
        raise UserError(
            f"RANK={env.rank} but this srun task is SLURM_PROCID={procid}: RANK/LOCAL_RANK were probably exported "
            "in the batch script, where they are the same for every task. Unset RANK, LOCAL_RANK and WORLD_SIZE "
            "(hpctrain reads Slurm's own variables), or set them per task: srun bash -c 'RANK=$SLURM_PROCID ...'"
        )


def slurm_port(job_id: int, step_id: int = 0) -> int:
    """Rendezvous port for a Slurm job step when MASTER_PORT is unset: the job's port (distributed/ports.py's
    job_port, the rule the batch scripts use too). Two jobs that still collide on one node fail at init with a
    message asking for MASTER_PORT, which always wins."""
    return job_port(job_id, step_id)


class SlurmProbe:
    """A task started by srun. The batch script itself is not one: it has no SLURM_STEP_ID."""

    name = "slurm"

    def __init__(self, required: bool = False) -> None:
        self.required = required  # --dist-init-method slurm: not being an srun task is an error

    def detect(self, environ: Mapping[str, str]) -> DistEnv | None:
        v = Vars(environ)
        if not (v.has("SLURM_STEP_ID") or v.has("SLURM_STEPID")):
            return self._not_a_task(v)
        why = "srun sets it for every task"
        rank = v.required_int("SLURM_PROCID", why=why)
        world_var = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") if v.has(n)), None)
        if world_var is None:
            raise UserError("SLURM_STEP_NUM_TASKS and SLURM_NTASKS are unset in an srun task; launch with srun -n N")
        world_size = v.required_int(world_var, why=why, minimum=1)
        local_rank = v.required_int("SLURM_LOCALID", why=why)
        node_rank = v.required_int("SLURM_NODEID", why=why)
        counts_var = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if v.has(n)), None)
        if counts_var is None:
            counts = [world_size]  # no per-node counts: only consistent with a single node
        else:
            try:
                counts = expand_tasks_per_node(v.text(counts_var) or "")
            except ValueError as err:
                raise UserError(f"{counts_var}: {err}; launch with srun, which sets it") from None
        nodes_var = next((n for n in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if v.has(n)), None)
        num_nodes = v.required_int(nodes_var, why=why, minimum=1) if nodes_var else len(counts)
        if len(counts) != num_nodes or sum(counts) != world_size:
            raise UserError(
                f"{counts_var or 'the task counts'}={v.text(counts_var or '') or counts} does not describe "
                f"{world_size} tasks ({world_var}) on {num_nodes} node(s) ({nodes_var}): the Slurm variables "
                "disagree (were some exported by hand, or inherited from another job?); unset them and launch with srun"
            )
        if not 0 <= node_rank < num_nodes:
            raise UserError(
                f"SLURM_NODEID={node_rank} is outside 0..{num_nodes - 1} ({nodes_var}={num_nodes}); launch with srun"
            )
        master_addr, master_port = v.text("MASTER_ADDR"), v.port("MASTER_PORT")
        if world_size > 1:  # a single task needs no rendezvous (nor a parsable node list)
            master_addr = master_addr or _head_node(v)
            if master_port is None:
                job_id = v.required_int("SLURM_JOB_ID", why="hpctrain derives the rendezvous port from it")
                step = v.text("SLURM_STEP_ID") or v.text("SLURM_STEPID") or "0"
                master_port = slurm_port(job_id, int(step) if step.isdigit() else 0)
        return DistEnv(
            launcher="slurm",
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=counts[node_rank],
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=master_addr,
            master_port=master_port,
            init_method=_rendezvous(world_size),
        )

    def _not_a_task(self, v: Vars) -> None:
        in_job = v.has("SLURM_JOB_ID")
        if self.required:
            raise UserError(
                "--dist-init-method slurm, but this process was not started by srun (SLURM_STEP_ID is unset"
                + ("; this looks like the batch script itself, where SLURM_PROCID is always 0" if in_job else "")
                + "): launch it with `srun python ...` inside the job"
            )
        tasks = v.number("SLURM_NTASKS") if in_job else None
        if tasks is not None and tasks > 1:
            log.warning(
                "running as a single process in the batch script of a job with %d tasks; "
                "start the script with `srun` to use them all",
                tasks,
            )
        return None


def _head_node(v: Vars) -> str:
    """The first host of the step (or job): rank 0 always runs there under Slurm's default task layout."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        text = v.text(name)
        if text is not None:
            try:
                return first_host(text)
            except ValueError as err:
                raise UserError(f"{name}: {err}; set MASTER_ADDR to the first node's host name") from None
    raise UserError(
        "cannot tell the head node: SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset; "
        "set MASTER_ADDR to the first node's host name"
    )


class KubeflowProbe:
    """One process per pod/node with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (Kubeflow PyTorchJob etc.)."""

    name = "kubeflow"

    def detect(self, environ: Mapping[str, str]) -> DistEnv | None:
        v = Vars(environ)
        if not v.has("RANK", "WORLD_SIZE") or v.has("LOCAL_RANK"):
            return None
        plan = kubeflow_node_plan(environ)
        if plan is not None:
            raise UserError(
                f"PET_NPROC_PER_NODE={plan.nproc_per_node} asks for {plan.nproc_per_node} processes in this pod, "
                "but it runs one: start the script under torchrun (torchrun --nproc-per-node=$PET_NPROC_PER_NODE "
                "--nnodes=$PET_NNODES --node-rank=$PET_NODE_RANK --master-addr=$MASTER_ADDR "
                "--master-port=$MASTER_PORT script.py), use `hpctrain train`, which starts them, or set nprocPerNode "
                "to 1"
            )
        return per_node(v, "kubeflow")


def per_node(v: Vars, launcher: str) -> DistEnv:
    why = "the launcher sets RANK and WORLD_SIZE for each node"
    world_size = v.required_int("WORLD_SIZE", why=why, minimum=1)
    rank = v.required_int("RANK", why=why)
    return DistEnv(
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=0,
        local_world_size=1,
        node_rank=rank,
        num_nodes=world_size,
        master_addr=v.text("MASTER_ADDR"),
        master_port=v.port("MASTER_PORT"),
        init_method=_rendezvous(world_size),
    )


class SingleProcessProbe:
    """Nothing launched us: one process. Stray RANK/WORLD_SIZE alone would otherwise be silently ignored."""

    name = "none"

    def detect(self, environ: Mapping[str, str]) -> DistEnv:
        v = Vars(environ)
        world_size = v.number("WORLD_SIZE", minimum=1)
        rank = v.number("RANK")
        if (world_size or 1) > 1 or (rank or 0) > 0:
            present, absent = ("RANK", "WORLD_SIZE") if world_size is None else ("WORLD_SIZE", "RANK")
            raise UserError(
                f"{present}={v.text(present)} is set but {absent} is not: a multi-process job needs RANK, "
                f"WORLD_SIZE, MASTER_ADDR and MASTER_PORT; set all four, or unset {present} to run one process"
            )
        return DistEnv("none", 0, 1, 0, 1, 0, 1, None, None, None)


# Order is the contract (see the module docstring).
PROBES: tuple[Probe, ...] = (SpawnProbe(), TorchrunProbe(), SlurmProbe(), KubeflowProbe(), SingleProcessProbe())


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times the launcher has restarted this run (0: the first attempt); a malformed count is an error
    naming the variable, never a guess."""
    v = Vars(os.environ if environ is None else environ)
    why = "the number of earlier attempts, set by the launcher"
    return max(v.number(name, hint=why) or 0 for name in RESTART_COUNT_VARS)


AUTO_RESUME_VAR = "HPCTRAIN_AUTO_RESUME"
"""Set to 1 by a launcher that may restart the run without saying so (a Kubernetes pod restarted in place carries
no restart count): the run then resumes from its newest checkpoint when there is one, as a restarted attempt does."""


def may_be_a_restart(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process may be a later attempt of its run: a launcher's restart count above 0, or
    AUTO_RESUME_VAR."""
    environ = os.environ if environ is None else environ
    return restart_count(environ) > 0 or environ.get(AUTO_RESUME_VAR, "").strip() == "1"


def kubeflow_node_plan(environ: Mapping[str, str] | None = None) -> NodePlan | None:
    """Workers this node must start itself, or None when this process is already one worker.

    Kubeflow's PyTorchJob (and platforms like it) start one `python` per pod with RANK = the pod's index and
    WORLD_SIZE = pods x PET_NPROC_PER_NODE (older operators: pods). Only an explicit integer
    PET_NPROC_PER_NODE above 1 asks for workers; its default, "auto", keeps one process per pod (which may
    drive all local GPUs), as `python script.py` has always run there.
    """
    v = Vars(os.environ if environ is None else environ)
    if v.has("LOCAL_RANK") or v.has("TORCHELASTIC_RUN_ID") or v.text("HPCTRAIN_LAUNCHER") == "spawn":
        return None  # already a worker
    raw = v.text("PET_NPROC_PER_NODE")
    if raw is None or not v.has("RANK", "WORLD_SIZE") or not raw.isdigit():
        return None
    nproc = v.number("PET_NPROC_PER_NODE", minimum=1) or 1
    if nproc == 1:
        return None
    why = "the platform sets it for each pod"
    world_size = v.required_int("WORLD_SIZE", why=why, minimum=1)
    nnodes_raw = v.text("PET_NNODES")
    if nnodes_raw is not None and not nnodes_raw.isdigit():
        raise UserError(
            f"PET_NNODES={nnodes_raw!r} is an elastic range; hpctrain starts a fixed number of workers: "
            "run the script under torchrun for elastic jobs, or set a fixed number of replicas"
        )
    num_nodes = v.number("PET_NNODES", minimum=1)
    if num_nodes is None:
        if world_size % nproc:
            raise UserError(
                f"WORLD_SIZE={world_size} is not a multiple of PET_NPROC_PER_NODE={nproc}; "
                "set PET_NNODES to the number of pods"
            )
        num_nodes = world_size // nproc
    if world_size not in (num_nodes * nproc, num_nodes):
        raise UserError(
            f"WORLD_SIZE={world_size} matches neither PET_NNODES x PET_NPROC_PER_NODE = {num_nodes * nproc} "
            f"nor PET_NNODES = {num_nodes}; fix the job's replica count or these variables"
        )
    node_rank = v.number("PET_NODE_RANK")
    if node_rank is None:
        node_rank = v.required_int("RANK", why=why)
    if node_rank >= num_nodes:
        raise UserError(f"node rank {node_rank} is outside 0..{num_nodes - 1} (PET_NNODES={num_nodes}); fix the job")
    master_addr = v.text("MASTER_ADDR")
    master_port = v.port("MASTER_PORT")
    if master_addr is None or master_port is None:
        raise UserError(
            "PET_NPROC_PER_NODE is set but MASTER_ADDR/MASTER_PORT are not: set both to the master pod's "
            "address and a free port"
        )
    return NodePlan(num_nodes, node_rank, nproc, master_addr, master_port)


def slurm_node_plan(environ: Mapping[str, str], visible_gpus: int) -> NodePlan | None:
    """Workers an srun task must start itself because it owns several GPUs, or None.

    `srun --ntasks-per-node=1 --gpus-per-task=G` (or --gpus-per-node=G with one task per node) starts one process
    per node that sees G GPUs; DDP wants one process per GPU. As for Kubeflow's PET_NPROC_PER_NODE, the task then
    starts G workers: node rank = SLURM_NODEID, world = nodes x G, rendezvous at the task's own MASTER_ADDR/PORT
    (the head node and the job's derived port). A single task on a single node returns None here (the local
    one-process-per-GPU plan covers it). Several tasks per node that each own several GPUs are refused: their
    ranks cannot be renumbered per GPU without talking, and one GPU per task would leave the rest idle.
    """
    v = Vars(environ)
    if not (v.has("SLURM_STEP_ID") or v.has("SLURM_STEPID")):
        return None
    if v.has("LOCAL_RANK") or v.has("TORCHELASTIC_RUN_ID") or v.text("HPCTRAIN_LAUNCHER") == "spawn":
        return None  # already a worker (torchrun or our spawner under srun)
    per_task_text = v.text("SLURM_GPUS_PER_TASK") or ""
    count = per_task_text.rsplit(":", 1)[-1]
    per_task = int(count) if count.isdigit() else None
    env = SlurmProbe().detect(environ)
    assert env is not None
    if env.local_world_size > 1:
        if per_task is not None and per_task > 1:
            raise UserError(
                f"each of the {env.local_world_size} tasks on this node owns {per_task} GPUs "
                f"(SLURM_GPUS_PER_TASK={per_task_text}), but hpctrain trains with one process per GPU: use "
                f"--ntasks-per-node={env.local_world_size * per_task} --gpus-per-task=1, or --ntasks-per-node=1 "
                f"--gpus-per-task={per_task} (the task then starts one worker per GPU)"
            )
        return None
    gpus = per_task if per_task is not None and 0 < per_task <= visible_gpus else visible_gpus
    if gpus <= 1 or env.world_size == 1:
        return None
    if env.world_size != env.num_nodes:
        raise UserError(
            f"this node runs one task with {gpus} GPUs but the job has {env.world_size} tasks on {env.num_nodes} "
            "node(s): an uneven layout hpctrain cannot spread one process per GPU over; use the same "
            "--ntasks-per-node on every node (1 with --gpus-per-task=G, or G with --gpus-per-task=1)"
        )
    assert env.master_addr is not None and env.master_port is not None
    return NodePlan(env.num_nodes, env.node_rank, gpus, env.master_addr, env.master_port)
