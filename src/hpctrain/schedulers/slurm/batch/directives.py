"""What can be written on an #SBATCH line, and the job's values Slurm writes there, checked by Slurm.

sbatch reads #SBATCH lines with its own parser, not a shell: a value must not hold control characters (a second
line), backslashes or both kinds of quote, and an extra option (--sbatch) must be exactly one option. SlurmOptions
runs these rules on its values, `check_job_values` on a JobSpec's before any line is rendered; another backend
never sees them (it has rules of its own for the same values, e.g. a Kubernetes name).
"""

from __future__ import annotations

import re
import shlex

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec

# Values written unquoted after #SBATCH; anything else is double- or single-quoted (see sbatch_value).
SBATCH_SAFE_RE = re.compile(r"^[A-Za-z0-9_.,:=/%@+-]+$")


def check_job_values(job: JobSpec) -> None:
    """The job's own text that goes on #SBATCH lines (its name; its time limit and memory are numbers, rendered by
    Slurm's own forms): refused with the fix when sbatch could not read it back faithfully. (SlurmOptions checks
    its own values, the interpreter among them.)"""
    check_sbatch_value("--job-name", job.name)


def _check_no_control_characters(what: str, value: str) -> None:
    bad = sorted({repr(c) for c in value if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise UserError(
            f"{what} {value!r} contains control characters ({', '.join(bad)}): sbatch reads it from one "
            "#SBATCH line; remove them"
        )


def check_sbatch_value(what: str, value: str) -> None:
    """#SBATCH lines are parsed by sbatch, not by a shell: refuse what cannot be written there faithfully."""
    if not value:
        raise UserError(f"{what} is empty: give a value or leave the option out")
    _check_no_control_characters(what, value)
    if "\\" in value or ('"' in value and "'" in value):
        raise UserError(
            f"{what} {value!r} cannot be written on an #SBATCH line: remove backslashes, and use only one kind of quote"
        )


_LONG_OPTION_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9-]*$")
_SHORT_OPTION_RE = re.compile(r"^-[A-Za-z]$")


def parse_sbatch_option(text: str) -> tuple[str, str | None]:
    """One extra sbatch option, as the user would type it after sbatch, -> (option, value or None).

    Exactly one option: `--flag`, `--name=VALUE`, `--name VALUE`, `-X` or `-X VALUE` (shell quoting allowed:
    `--comment='two words'`). A separate VALUE must not start with '-' (write `--nice=-5`); a short option with
    its value attached (`-Ca100`) is refused, because `-vH` would be two options. Anything else, e.g.
    `--comment --output=/x`, would put a second option on the #SBATCH line and is refused."""
    what = f"--sbatch {text!r}"
    if not isinstance(text, str):
        raise UserError(f"extra sbatch option {text!r} must be a string such as --exclusive or --constraint=a100")
    _check_no_control_characters("--sbatch", text)
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise UserError(
            f"{what}: {err} (unbalanced quotes); quote a value with spaces once: --comment='two words'"
        ) from None
    usage = "one sbatch option per --sbatch: --flag, --name=VALUE, --name VALUE or -X VALUE"
    if not words:
        raise UserError(f"{what} is empty: give {usage}")
    first, rest = words[0], words[1:]
    if first.startswith("--") and "=" in first and not rest:
        name, _, value = first.partition("=")
        if _LONG_OPTION_RE.match(name):
            check_sbatch_value(f"{what}: the value", value)
            return name, value
    elif _LONG_OPTION_RE.match(first) or _SHORT_OPTION_RE.match(first):
        if not rest:
            return first, None
        if len(rest) == 1 and not rest[0].startswith("-"):
            check_sbatch_value(f"{what}: the value", rest[0])
            return first, rest[0]
    if not first.startswith("-"):
        raise UserError(f"{what} must start with - (e.g. --sbatch=--exclusive or --sbatch=--constraint=a100)")
    looks_like_option = [bool(_LONG_OPTION_RE.match(w.partition("=")[0]) or _SHORT_OPTION_RE.match(w)) for w in words]
    if len(words) == 2 and looks_like_option[0] and not looks_like_option[1] and "=" not in first:
        raise UserError(f"{what}: the value {rest[0]!r} starts with '-'; attach it with = ({first}={rest[0]})")
    if len(words) > 1 and all(w.startswith("-") for w in words):
        raise UserError(f"{what} holds {len(words)} options; give {usage}, and repeat --sbatch for each one")
    if len(words) > 2 or (len(words) == 2 and "=" in first):
        raise UserError(
            f"{what} is {len(words)} words; give {usage} (quote a value with spaces: --comment='two words')"
        )
    raise UserError(
        f"{what} is not one sbatch option; give {usage} (a short option takes its value after a space: -C a100)"
    )


# sbatch options the script writes from hpctrain's own flags: a second #SBATCH line of one (sbatch takes the last)
# would make the job differ from what hpctrain renders around it (torchrun's --nnodes, the requeue budgets).
OWN_OPTIONS = {
    "--nodes": "--nodes N or MIN:MAX",
    "-N": "--nodes N or MIN:MAX",
    "--ntasks": "--nodes and --nproc-per-node",
    "-n": "--nodes and --nproc-per-node",
    "--ntasks-per-node": "--nproc-per-node",
    "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task",
    "--no-kill": "--nodes MIN:MAX (an elastic job keeps its allocation when a node fails)",
    "-k": "--nodes MIN:MAX (an elastic job keeps its allocation when a node fails)",
}


def refuse_own_option(text: str) -> None:
    """An extra option (accepted by parse_sbatch_option) that hpctrain writes itself is refused naming its flag."""
    name, _ = parse_sbatch_option(text)
    if name in OWN_OPTIONS:
        raise UserError(
            f"--sbatch {text!r}: hpctrain writes {name} itself from its own flags; use {OWN_OPTIONS[name]} instead"
        )


def render_sbatch_option(text: str) -> str:
    """An extra option as written after #SBATCH (text was accepted by parse_sbatch_option)."""
    name, value = parse_sbatch_option(text)
    if value is None:
        return name
    return f"{name}={sbatch_value(value)}" if name.startswith("--") else f"{name} {sbatch_value(value)}"


def sbatch_value(value: str) -> str:
    """Quote a checked value for an #SBATCH line the way sbatch's own parser undoes it."""
    if SBATCH_SAFE_RE.match(value):
        return value
    return f"'{value}'" if '"' in value else f'"{value}"'
