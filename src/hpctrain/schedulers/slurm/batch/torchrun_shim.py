"""The lines of Python a Slurm batch script runs torchrun through (TORCHRUN_SHIM), in the job's own environment.

The batch script holds TORCHRUN_SHIM in single quotes and runs it as `python -c "$hpctrain_torchrun" SIGNALS
SHUTDOWN_TIMEOUT TORCHRUN_ARGS...` on every node (script.step_command). It works on every torch from the floor
up: it detects what the job's torchrun can do rather than trusting the submitting machine's torch.

The program is a Python file of its own, programs/torchrun_shim.py (linted and formatted as code, not a string
here), that hpctrain never imports: it is text of the batch script (its golden files hold it), and the lines it
prints are the job's own, in the job's log. So it stays beside script.py rather than under launch/ (which runs
local processes from hpctrain itself), and the rule that nothing under schedulers/ prints does not reach into it.
"""

from __future__ import annotations

from importlib import resources

from hpctrain.stops import EXIT_HUNG, EXIT_PREEMPTED, EXIT_SICK_NODE

TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# torchrun's own shutdown timeout before --shutdown-timeout existed (torch < 2.9): workers get this long to stop.
TORCHRUN_FIXED_SHUTDOWN_S = 30

# The program is a file of its own (programs/torchrun_shim.py, checked by ruff like any other), read as text.
PROGRAM = resources.files("hpctrain.schedulers.slurm.batch").joinpath("programs", "torchrun_shim.py").read_text()
SETTINGS = {
    "FIXED_S": str(TORCHRUN_FIXED_SHUTDOWN_S),
    "PREEMPTED_STATUS": str(EXIT_PREEMPTED),
    "PLANNED_STATUSES": f"({EXIT_HUNG}, {EXIT_SICK_NODE})",
}


def _rendered(program: str) -> str:
    """The program as the batch script holds it: its settings filled in, full-line comments and blank lines out."""
    lines, filled = [], set()
    for line in program.splitlines():
        name = line.split(" = ", 1)[0]
        if name in SETTINGS:
            line, _ = f"{name} = {SETTINGS[name]}", filled.add(name)
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line)
    text = "\n".join(lines) + "\n"
    if filled != set(SETTINGS):
        raise AssertionError(f"programs/torchrun_shim.py lacks the setting lines {sorted(set(SETTINGS) - filled)}")
    if "'" in text:
        raise AssertionError("programs/torchrun_shim.py: the batch script holds it in single quotes, use double ones")
    return text


TORCHRUN_SHIM = _rendered(PROGRAM)
_BARRIER_START, _BARRIER_END = "# -- exit barrier", "# -- end of exit barrier --"
EXIT_BARRIER = PROGRAM[PROGRAM.index(_BARRIER_START) : PROGRAM.index(_BARRIER_END)]
"""The agents' exit barrier and store release the program installs in torchrun, as their own source (a test runs
them; they need `store_util` bound to torch.distributed.elastic.utils.store)."""
