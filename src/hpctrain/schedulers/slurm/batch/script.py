"""The Slurm batch script: rendered from a JobSpec and resolved SlurmOptions (pure), submitted with sbatch (thin).

Read top to bottom, this module follows the script it writes: render_sbatch first, then its parts in the order the
script holds them (the summary, the #SBATCH lines, the traps, the rendezvous, the srun step), then sbatch itself.
The script's own requeues, its run directory's counters and restart budgets before the step and its decisions
after it, are requeue.py's.

render_sbatch() reads nothing but its arguments: no cluster queries, no clock, no paths of the submitting machine
beyond those the user gave. It resolves the options for the job once (options.checked_for_job: the launcher chosen
and everything Slurm cannot run refused) and hands the resolved options to every part below, which never resolve
them again. Every user value in the script body goes through shlex.quote; values on #SBATCH lines were checked by
options.py (sbatch parses those lines itself, so a shell quote would not help there) and are quoted here the way
sbatch's own parser undoes it (sbatch_value).

The script starts the job step in the background and waits for it, so that its traps run at once:
  * SIGUSR1 (asked for with --signal=B:USR1@GRACE before the time limit) is forwarded to srun, which forwards it
    to every process of the step (slurmstepd signals the whole step, workers included): always to a built-in
    recipe, to a user's command only once it has said it handles it (hpctrain.training.StopRequest leaves
    SIGNALS_FILE): Python's default action for SIGUSR1 ends the process. torchrun runs through TORCHRUN_SHIM
    (torchrun_shim.py), which asks the job's own torchrun for --signals-to-handle and otherwise handles USR1
    itself, and ends a planned stop with the planned status (75 or 143) and one log line instead of torchrun's
    traceback.
  * SIGTERM that reaches only the batch shell is passed to the step with `scancel --signal=TERM` (srun would turn a
    TERM into a SIGKILL of the step); the training loop checkpoints and stops, and the job is not requeued.
  * After a warning, if the run said it stopped with its state saved (RUN_DIR/stop_reason says "preempted"), the
    script requeues the job itself, within --max-requeues; the requeued attempt resumes from its checkpoint. After
    a hang or a sick node it requeues within --max-hang-restarts. Anything else would start it again from scratch.

Everything the script reads back from the run directory is untrusted (other processes, other users, a crash wrote
it): counters are read only from regular files, at most a few bytes, as decimal numbers (`10#`: a leading zero is
not octal); a counter that cannot be written refuses the requeue rather than let a budget never run out; node lists
are hostlist expressions, expanded by `scontrol show hostnames`. And every requeue is bounded besides by Slurm's
own restart count (SLURM_RESTART_COUNT), which nothing in the run directory can reset.

The shell functions and blocks are programs of their own, programs/*.sh beside this module (bash -n and shellcheck
check them as they stand, tests/test_program_templates.py); this module chooses which the script holds and fills
in their values (budgets, file names), hpctrain.program_text's `@NAME@` words.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpctrain import program_text
from hpctrain.distributed.ports import job_port_lines
from hpctrain.distributed.probes import ELASTIC_MAX_NODES_VAR, ELASTIC_MIN_NODES_VAR
from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.jobs.values import format_duration
from hpctrain.schedulers.slurm.batch.environments import get_environment, quote_path
from hpctrain.schedulers.slurm.batch.options import SlurmOptions, checked_for_job, gres, parse_sbatch_option, uses_gpus
from hpctrain.schedulers.slurm.batch.requeue import (
    elastic_lines,
    hang_lines,
    helper_lines,
    requeues_itself,
    restart_budget_lines,
    stop_reason_lines,
    warning_requeue_lines,
)
from hpctrain.schedulers.slurm.batch.torchrun_shim import TORCHRUN_SHIM, TORCHRUN_SIGNALS
from hpctrain.schedulers.slurm.commands import Runner, run_bounded, slurm
from hpctrain.schedulers.slurm.grammar import mem_mb, slurm_mem
from hpctrain.stops import SIGNALS_FILE

# Values written unquoted after #SBATCH; anything else is double- or single-quoted (see sbatch_value).
SBATCH_SAFE_RE = re.compile(r"^[A-Za-z0-9_.,:=/%@+-]+$")


def render_sbatch(job: JobSpec, options: SlurmOptions | None = None) -> str:
    """The complete batch script for `job` with Slurm's `options` (None: their defaults). Pure: same JobSpec and
    options, same text. What Slurm cannot run is refused before anything is rendered."""
    options = checked_for_job(options, job)
    elastic = job.resources.elastic
    out: list[str] = [
        "#!/bin/bash",
        *summary_lines(job, options),
        "# Rendered by hpctrain (hpctrain submit --dry-run shows this script).",
        "# Values are single-quoted on purpose: a $ in them is literal text.",
        "# shellcheck disable=SC2016",
    ]
    out += sbatch_directives(job, options)
    out += [
        "",
        "# No `set -e`: the step's exit status is collected and acted on below.",
        "set -uo pipefail",
        "",
        "# Traps first: a signal that arrives while the environment is set up must not kill this shell. They",
        "# forward to the step once it runs (a warning that came earlier is passed on as soon as it starts).",
        "warned=0",
        "cancelled=0",
        'step_pid=""',
        *warning_lines(job),
        "trap 'warned=1; forward_warning' USR1",
        # srun would turn a TERM into a SIGKILL of the step: ask Slurm to pass it on (scancel itself already has).
        'trap \'cancelled=1; if [ -n "$step_pid" ]; then scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null; '
        "else exit 143; fi' TERM INT",
        "",
        'echo "hpctrain: job ${SLURM_JOB_ID} attempt $((${SLURM_RESTART_COUNT:-0} + 1)) on ${SLURM_JOB_NODELIST}, '
        '$(date -u +%Y-%m-%dT%H:%M:%SZ)"',
    ]
    exports = list(job.env)
    if job.run_dir is not None:
        out.append(f"run_dir={_run_dir_words(job.run_dir)}")
        out.append('export HPCTRAIN_RUN_DIR="$run_dir"')
        if requeues_itself(job, options):
            out += ["", *helper_lines(), *restart_budget_lines(job, options)]
    if elastic:
        # The workers' check that srun's torchrun copies formed one world allows a group of MIN nodes or more.
        exports.append((ELASTIC_MIN_NODES_VAR, str(job.resources.min_nodes)))
        exports.append((ELASTIC_MAX_NODES_VAR, str(job.resources.nodes)))  # recorded: status shows "1 of 1:2"
    if exports:
        out += [f"export {key}={_q(value)}" for key, value in exports]
    setup = get_environment(options.environment).setup_lines()
    if setup:
        out += ["", f"# Environment: {options.environment.kind}"] + setup
    if options.launcher == "torchrun":
        out += rendezvous_lines(options, elastic)
    step = " ".join(step_command(job, options))
    out += ["", *_program("run_step.sh", STEP_COMMAND=step)]
    elastic_end = elastic and job.run_dir is not None
    if job.signal_grace or requeues_itself(job, options) or elastic_end:
        out += stop_reason_lines(job)
    if elastic_end:
        out += elastic_lines()
    if job.run_dir is not None and options.max_hang_restarts:
        out += hang_lines(job, options)
    if job.signal_grace:
        out += warning_requeue_lines(job, options)
    out += ['echo "hpctrain: step finished with exit status ${status}"', 'exit "$status"', ""]
    return "\n".join(out)


def _resolved(options: SlurmOptions) -> SlurmOptions:
    """The parts below take the options resolved for the job: a launcher of None would render the wrong lines."""
    if options.launcher is None:
        raise ValueError("resolve the Slurm options for the job first (options.checked_for_job)")
    return options


def _q(word: str) -> str:
    return shlex.quote(word)


def _program(name: str, **values: object) -> list[str]:
    """The lines of programs/<name> (a shell fragment of the batch script, linted as one) with its values filled."""
    return program_text.lines(__package__, name, **values)


# --- The head of the script: what the job runs and asks for, and its #SBATCH lines ---


def summary_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """What the job runs and asks for, at the top of the script: the rest is the machinery around it. `options`
    resolved (options.for_job)."""
    r = job.resources
    layout = "1 process" if options.launcher == "single" else f"{r.node_range} node(s) x {r.nproc_per_node} process(es)"
    if r.elastic:
        layout += f", elastic: up to {job.max_restarts} membership change(s)"
    request = gres(job, options)
    asks = [f"{layout} ({options.launcher})", f"{r.cpus_per_task} CPU(s) per process"]
    asks += [f"--gres {request}"] if request else []
    asks += [f"--mem {r.mem}"] if r.mem is not None else []
    asks += [f"--time {job.time}"] if job.time is not None else []
    asks += [f"--partition {options.partition}"] if options.partition is not None else []
    if not job.signal_grace:
        warning = "no time-limit warning"
    elif job.is_recipe:
        warning = f"SIGUSR1 {job.signal_grace} s before the time limit: checkpoint, stop, requeue"
    else:
        warning = (
            f"SIGUSR1 {job.signal_grace} s before the time limit, only if the program said it handles it; "
            "requeued only if it said it saved its state"
        )
    return [
        f"# Job:       {_comment_text(shlex.join(job.command))}",
        f"# Resources: {_comment_text(', '.join(asks))}",
        f"# Run dir:   {_comment_text(job.run_dir) if job.run_dir is not None else '(none)'}; {warning}",
    ]


def _comment_text(text: str) -> str:
    """User text for a comment line: a line break (or any control character) must not end the comment."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def sbatch_directives(job: JobSpec, options: SlurmOptions) -> list[str]:
    """The #SBATCH options, in a fixed order (golden files depend on it). `options` resolved and checked against the
    job (options.checked_for_job): the values were refused there if sbatch could not read them back faithfully."""
    options = _resolved(options)
    r = job.resources
    opts: list[tuple[str, str | None]] = [("--job-name", job.name)]
    for name in ("partition", "account", "qos"):
        value = getattr(options, name)
        if value is not None:
            opts.append((f"--{name}", value))
    if job.exclude_nodes:
        opts.append(("--exclude", ",".join(job.exclude_nodes)))
    if job.time_limit_s is not None:
        opts.append(("--time", format_duration(job.time_limit_s)))
    if options.launcher == "single":
        opts += [("--nodes", "1"), ("--ntasks", "1"), ("--cpus-per-task", str(r.cpus_per_task))]
    elif options.launcher == "torchrun":
        # One task per node runs torchrun; it needs the CPUs of all its workers. An elastic job takes MIN to MAX
        # nodes and keeps its allocation when one fails (--no-kill): the survivors' torchrun re-forms without it.
        elastic = r.elastic
        opts += [
            ("--nodes", f"{r.min_nodes}-{r.nodes}" if elastic else str(r.nodes)),
            *([("--no-kill", None)] if elastic else []),
            ("--ntasks-per-node", "1"),
            ("--cpus-per-task", str(r.cpus_per_task * r.nproc_per_node)),
        ]
    else:
        opts += [
            ("--nodes", str(r.nodes)),
            ("--ntasks-per-node", str(r.nproc_per_node)),
            ("--cpus-per-task", str(r.cpus_per_task)),
        ]
    request = gres(job, options)
    if request:
        opts.append(("--gres", request))
    if r.mem_bytes is not None:
        opts.append(("--mem", slurm_mem(mem_mb(r.mem_bytes))))
    if options.output is not None:
        opts.append(("--output", options.output))
    if options.error is not None:
        opts.append(("--error", options.error))
    if job.signal_grace:
        # B: the batch shell gets the warning and forwards it (a plain --signal would bypass our traps).
        opts.append(("--signal", f"B:USR1@{job.signal_grace}"))
    if requeues_itself(job, options):
        opts += [("--requeue", None), ("--open-mode", "append")]
    lines = [
        f"#SBATCH {name}={sbatch_value(value)}" if value is not None else f"#SBATCH {name}" for name, value in opts
    ]
    lines += [f"#SBATCH {render_sbatch_option(extra)}" for extra in options.sbatch_extra]
    return lines


def sbatch_value(value: str) -> str:
    """Quote a checked value for an #SBATCH line the way sbatch's own parser undoes it."""
    if SBATCH_SAFE_RE.match(value):
        return value
    return f"'{value}'" if '"' in value else f'"{value}"'


def render_sbatch_option(text: str) -> str:
    """An extra option as written after #SBATCH (text was accepted by options.parse_sbatch_option)."""
    name, value = parse_sbatch_option(text)
    if value is None:
        return name
    return f"{name}={sbatch_value(value)}" if name.startswith("--") else f"{name} {sbatch_value(value)}"


# --- Before the step: the warning's trap and the run directory (its counters and budgets: requeue.py) ---


def warning_lines(job: JobSpec) -> list[str]:
    """The shell functions the USR1 trap calls: pass the warning on to the step, or say why not."""
    if job.is_recipe:
        return _program("forward_warning_recipe.sh")
    return _program("forward_warning_command.sh", SIGNALS_FILE=SIGNALS_FILE)


def _run_dir_words(run_dir: str) -> str:
    """A run dir for the shell; %j stands for the job id, as in sbatch's --output."""
    parts = run_dir.split("%j")
    quoted = [quote_path(parts[0]) if parts[0] else ""] + [_q(p) if p else "" for p in parts[1:]]
    return '"${SLURM_JOB_ID}"'.join(quoted)


# --- The rendezvous and the step ---


def rendezvous_lines(options: SlurmOptions, elastic: bool) -> list[str]:
    """torchrun's c10d rendezvous on the first node, its port, and the shim torchrun runs through."""
    out = [
        "",
        "# torchrun's c10d rendezvous lives on the first node of the allocation, where this script runs.",
        *(
            ["# An elastic job survives losing any other node; losing this one ends it, as it ends this script."]
            if elastic
            else []
        ),
        *_program("head_node.sh"),
    ]
    if options.rdzv_port is not None:
        out.append(f"rdzv_port={options.rdzv_port}")
    else:
        out += job_port_lines("rdzv_port", "hpctrain: no free rendezvous port found; set one with --rdzv-port")
    return out + [
        'echo "hpctrain: torchrun rendezvous at ${head_node}:${rdzv_port}"',
        "# torchrun runs through these lines of Python in the job's environment: they ask its torchrun for the",
        "# signal flags (torch >= 2.9) or handle the signals themselves, end a planned stop without a traceback,",
        "# and keep the rendezvous store's host (the first node) to the last on every torch.",
        "hpctrain_torchrun='" + TORCHRUN_SHIM + "'",
    ]


def step_command(job: JobSpec, options: SlurmOptions) -> list[str]:
    """The srun line as shell words (quoted), without the trailing `&`. `options` resolved (options.for_job)."""
    launcher = _resolved(options).launcher
    r = job.resources
    elastic = r.elastic
    env = get_environment(options.environment)
    gpus = uses_gpus(job, options)
    words = ["srun"]
    if launcher == "single":
        words += ["--nodes=1", "--ntasks=1"]
    elif launcher == "torchrun":
        words += ["--ntasks-per-node=1"]
    else:
        words += [f"--ntasks-per-node={r.nproc_per_node}"]
    # Slurm 22.05+ no longer passes the batch's --cpus-per-task on to srun: say it again.
    cpus = r.cpus_per_task * (r.nproc_per_node if launcher == "torchrun" else 1)
    # An elastic step keeps its other tasks when one ends (a lost node's torchrun: --kill-on-bad-exit=0) and when
    # a node goes DOWN (--no-kill: without it srun ends every task of the step on "Node failure on node2", as it
    # did on Slurm 22.05 in tests/test_elastic_slurm.py): the survivors re-form without it.
    words += [f"--cpus-per-task={cpus}", f"--kill-on-bad-exit={0 if elastic else 1}"]
    if elastic:
        words.append("--no-kill")
    # --quiet: srun's notes on ending a step ("Job step aborted: Waiting up to...", "Terminating StepId") would
    # surround every planned stop; its errors, which the script explains after a planned stop, still show.
    words.append("--quiet")
    words += env.srun_options(gpus)
    words += env.command_prefix(gpus)
    if launcher == "torchrun":
        # TORCHRUN_SHIM (the script's $hpctrain_torchrun) decides about the signal flags with the job's torchrun.
        signals, timeout = (TORCHRUN_SIGNALS, max(10, job.signal_grace - 10)) if job.signal_grace else ("", 0)
        words += [
            _q(options.python) if options.python is not None else "python3",
            "-c",
            '"$hpctrain_torchrun"',
            _q(signals),
            str(timeout),
            f"--nnodes={r.min_nodes}:{r.nodes}" if elastic else '--nnodes="$SLURM_NNODES"',
            f"--nproc-per-node={r.nproc_per_node}",
            "--rdzv-backend=c10d",
            '--rdzv-endpoint="$head_node:$rdzv_port"',
            '--rdzv-id="$SLURM_JOB_ID"',
        ]
        if job.max_restarts:
            words.append(f"--max-restarts={job.max_restarts}")
        words.append("--no-python")
    words += _command_words(job, options.python)
    return words


# The tools of the submitting Python, run as modules of its interpreter (SlurmOptions.python) rather than found on
# PATH.
_TOOL_MODULES = {"hpctrain": "hpctrain"}


def _command_words(job: JobSpec, python: str | None) -> list[str]:
    """The command as shell words. A recipe's run directory is the script's $run_dir, expanded once (%j is the job
    id), so that the training writes where the requeue logic and `hpctrain status` look."""
    command = list(job.command)
    words = _tool(python, "hpctrain") if command[0] == "hpctrain" else [_q(command[0])]
    if not (job.is_recipe and job.run_dir is not None):
        return words + [_q(a) for a in command[1:]]
    rest, given = [], False
    args = iter(command[1:])
    for arg in args:
        if arg == "--run-dir":
            rest += [arg, '"$run_dir"']
            next(args, None)
            given = True
        elif arg.startswith("--run-dir="):
            rest.append('--run-dir="$run_dir"')
            given = True
        else:
            rest.append(_q(arg))
    if not given:  # the recipe's default (or an abbreviated --run-d): argparse keeps the last one given
        rest += ["--run-dir", '"$run_dir"']
    return words + rest


def _tool(python: str | None, name: str) -> list[str]:
    """`hpctrain` as shell words: `PYTHON -m MODULE` when the job knows its interpreter."""
    if python is None:
        return [name]
    return [_q(python), "-m", _TOOL_MODULES[name]]


# --- sbatch: submit the script, show it, keep it ---


def sbatch_argv(job: JobSpec) -> list[str]:
    """The sbatch command line; the script itself goes to its standard input (every option is in the script)."""
    return ["sbatch", "--parsable"]


def submit(job: JobSpec, script: str, run: Runner = run_bounded) -> str:
    """Submit `script` with sbatch and return the job id. `run` is injectable for unit tests."""
    proc = slurm(sbatch_argv(job), run=run, input=script, check=False)
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout or "").strip()
        raise UserError(f"sbatch refused the job (exit {proc.returncode}): {message}")
    first = (proc.stdout or "").strip().splitlines()
    job_id = first[-1].split(";")[0].strip() if first else ""
    if not job_id.isdigit():
        raise UserError(f"sbatch printed {proc.stdout!r} instead of a job id; submit the script by hand to see why")
    return job_id


def dry_run_text(job: JobSpec, script: str) -> str:
    """What --dry-run prints: the command, then the script."""
    return f"# {shlex.join(sbatch_argv(job))} <<'EOF'\n{script}EOF\n"


def write_script(path: Path, script: str) -> None:
    path.write_text(script, encoding="utf-8")
    path.chmod(0o755)
