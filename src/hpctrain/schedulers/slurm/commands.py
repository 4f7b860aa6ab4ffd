"""Run Slurm client commands (argv lists, never a shell) and turn their failures into errors that name the fix."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from hpctrain.errors import UserError

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def decoded(data: bytes | str | None) -> str:
    """A Slurm client's output as text: UTF-8, a byte that is not (a job name holds any byte but NUL, and `status
    --all-users` prints everyone's) shown as `\\xff` rather than failing the whole command. Decoded here, not by
    subprocess's text mode, which also turns every `\\r` into a line end."""
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "backslashreplace")


def run_text(
    run: Callable[..., subprocess.CompletedProcess], argv: Sequence[Any], input: str | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """`run(argv, capture_output=True, ...)` with byte pipes, its stdout and stderr decoded(); `input` goes in as
    UTF-8. Every command hpctrain runs for Slurm is run so."""
    if input is not None:
        kwargs["input"] = input.encode("utf-8", "surrogateescape")
    result = run(argv, capture_output=True, **kwargs)
    return subprocess.CompletedProcess(result.args, result.returncode, decoded(result.stdout), decoded(result.stderr))


_NO_CLIENT = (
    "`{cmd}` was not found: hpctrain needs the Slurm client commands on PATH. Run it on a login node of your "
    "cluster (after `module load slurm` where the cluster uses modules)"
)
_NO_CONTROLLER = (
    "`{line}` could not reach the Slurm controller ({err}). Check `scontrol ping`; if it fails too, the "
    "controller is down or unreachable from this host: ask the cluster's administrators"
)


def slurm(
    argv: Sequence[str], *, run: Runner = subprocess.run, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command (with `input` on its stdin) and return its result; raise UserError when the client is
    missing or, with check=True, when the command fails (its stderr is part of the message)."""
    argv = [str(a) for a in argv]
    try:
        result = run_text(run, argv, input=input, check=False)
    except FileNotFoundError:
        raise UserError(_NO_CLIENT.format(cmd=argv[0])) from None
    if check and result.returncode != 0:
        raise UserError(command_error(argv, result))
    return result


def command_error(argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> str:
    err = " ".join((result.stderr or result.stdout or "").split()) or f"exit status {result.returncode}"
    line = " ".join(argv[:3])
    lowered = err.lower()
    if "unable to contact slurm controller" in lowered or "connection refused" in lowered:
        return _NO_CONTROLLER.format(line=line, err=err)
    return f"`{line}` failed: {err}"
