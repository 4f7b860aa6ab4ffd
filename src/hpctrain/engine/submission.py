"""Build, check, preview and submit a job: the work of `hpctrain submit` and `hpctrain check`, and of the web
console's job form, as functions that take typed input and return data (they never print).

    job = build({"nodes": "1", "nproc_per_node": 2, "job_command": ["train", "mnist"]})  # flag dests -> values
    problems = check(job)            # [Problem]: the local checks, then the live cluster's
    rendered = preview(job)          # the exact sbatch script or manifest (Rendered)
    submitted = submit(job)          # Submitted: job id, scheduler, run directory, what the backend said
    done = resume(resume_plan(backend, "1234"))  # a new job that continues job 1234's run directory

The job's flags are declared once (engine.job_options.add_job_arguments, each backend's own through
BackendInfo.add_arguments): `hpctrain submit` parses them from its command line, the web form generates its fields
from the same parser (job_parser) and parses what was typed with it (flags_from_argv), so that bad input gets the
same one-line error in both. A Problem keeps the backend's line as it was said, and what a face shows beside it:
the fix (the clause that names it) and the field (the dest of the first flag the line names).
"""

from __future__ import annotations

import argparse
import functools
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.engine.job_options import Submission, add_job_arguments, submission_from_args
from hpctrain.engine.scheduling import get_backend
from hpctrain.errors import UserError
from hpctrain.schedulers import SCHEDULERS, base

ERROR, WARNING, NOTE = "error", "warning", "note"


class _RaisingParser(argparse.ArgumentParser):
    """A parse error is a UserError with argparse's own one line (`argument --nodes: expected one argument`)."""

    def error(self, message: str):
        raise UserError(message)


def job_parser(schedulers: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the job flags `hpctrain submit` and `hpctrain check` take: the common ones in their groups,
    then each backend's own in its groups (with their help text); the web form's fields are its actions.
    `schedulers`: only these backends' own flags (the web form: those its console shows); None: every one's.
    Made once per set of backends and shared (a submit reads it to build, to check and to name fields): read it,
    never add to it."""
    return _job_parser(tuple(SCHEDULERS if schedulers is None else schedulers))


@functools.cache
def _job_parser(schedulers: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = _RaisingParser(prog="hpctrain submit", add_help=False, exit_on_error=False)
    add_job_arguments(parser, schedulers)
    return parser


def job_dests(parser: argparse.ArgumentParser | None = None) -> dict[str, Any]:
    """Every job flag's dest -> its default (what a flag left out is)."""
    if parser is None:
        return dict(_dests())
    return {a.dest: a.default for a in parser._actions if a.dest != argparse.SUPPRESS}


@functools.cache
def _dests() -> dict[str, Any]:
    return job_dests(job_parser())


@functools.cache
def _flag_dests() -> dict[str, str]:
    """Every job flag's option string (`--nodes`, `-N`) -> its dest."""
    return {o: a.dest for a in job_parser()._actions for o in a.option_strings}


def job_flags(values: Mapping[str, Any]) -> dict[str, Any]:
    """The job flags among a command's parsed values (`vars(args)` of `hpctrain submit`, which has its own too)."""
    known = _dests()
    return {k: v for k, v in values.items() if k in known}


def flags_from_argv(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> dict[str, Any]:
    """The job flags in `argv` (`["--nodes", "2", "--partition", "gpu"]`), parsed and typed as `hpctrain submit`
    parses them (by `parser`, a job_parser); an unknown flag or a bad value is a UserError with the CLI's words."""
    parser = parser or job_parser()
    try:
        args, extras = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as err:
        raise UserError(str(err)) from None
    if extras:
        raise UserError(f"unrecognized arguments: {' '.join(extras)}")
    return vars(args)


@dataclass(frozen=True)
class Job:
    """A job as the flags and the job file describe it (Submission: the neutral JobSpec, the scheduler, its
    options), with the kubeconfig context it goes through where the backend has contexts."""

    submission: Submission
    context: str | None = None

    @property
    def spec(self) -> Any:
        return self.submission.job

    @property
    def scheduler(self) -> str:
        return self.submission.scheduler

    def backend(self) -> base.Scheduler:
        return get_backend(argparse.Namespace(context=self.context), self.scheduler, self.submission.options)


def build(
    flags: Mapping[str, Any],
    job_file: str | Path | None = None,
    job_file_text: tuple[str, str] | None = None,
    *,
    dry_run: bool = False,
    command_optional: bool = False,
) -> Job:
    """The job that `flags` (job flag dests -> values, as job_parser gives them; a left-out one keeps the job
    file's value) and a job file describe: `job_file` a path, or `job_file_text` (file name, text) as the web form
    gets it (its suffix says its format). `dry_run`: without a scheduler here, the offline default renders it.
    `command_optional`: without a command, the resources alone are checked (Submission.resources_only)."""
    known = job_dests()
    unknown = sorted(set(flags) - set(known))
    if unknown:
        raise UserError(f"unknown job option(s): {', '.join(unknown)}; see `hpctrain submit --help`")
    values = {**known, **{k: v for k, v in flags.items() if v is not None}}
    if job_file_text is None:
        if job_file is not None:
            values["job_file"] = str(job_file)
        return _built(values, dry_run, command_optional)
    name, text = job_file_text
    suffix = Path(name).suffix
    with tempfile.TemporaryDirectory(prefix="hpctrain-job-") as folder:
        path = Path(folder, f"job{suffix}")
        path.write_text(text)
        values["job_file"] = str(path)
        try:
            return _built(values, dry_run, command_optional)
        except UserError as err:  # say the name the user knows, not the copy's
            raise UserError(str(err).replace(str(path), name)) from None


def _built(values: dict[str, Any], dry_run: bool, command_optional: bool) -> Job:
    args = argparse.Namespace(**values)
    submission = submission_from_args(args, dry_run=dry_run, command_optional=command_optional)
    return Job(submission=submission, context=values.get("context"))


@dataclass(frozen=True)
class Problem:
    """One line a check said about a job: an error blocks a submission, a warning or a note does not."""

    line: str
    """The line as the check said it (warnings and notes with their `warning: `/`note: ` prefix)."""
    kind: str = ERROR
    fix: str = ""
    """The clause that names the fix (after the last `; `, else after the first `: `); empty where none."""
    field: str | None = None
    """The dest of the first job flag the line names (`--partition gpu: ...` -> partition), None where none."""
    prerequisite: bool = False
    """Something made once before the first submit (base.Prerequisite): `submit --dry-run` only notes it."""
    live: bool = False
    """Said by the live cluster's check (`--no-check` skips those)."""

    @property
    def blocking(self) -> bool:
        return self.kind == ERROR


def problem(line: str, live: bool = False, options: Mapping[str, str] | None = None) -> Problem:
    """A check's line as a Problem; `options`: flag -> dest (default: the job flags')."""
    if options is None:
        options = _flag_dests()
    kind = WARNING if line.startswith(base.WARNING_PREFIX) else NOTE if line.startswith(base.NOTE_PREFIX) else ERROR
    said = line.split(": ", 1)[1] if kind != ERROR else line
    fix = said.rsplit("; ", 1)[1] if "; " in said else said.split(": ", 1)[1] if ": " in said else ""
    flags = [f for f in re.findall(r"--[a-z][a-z0-9-]*", said) if f in options]
    return Problem(
        line=str(line),
        kind=kind,
        fix=fix,
        field=options[flags[0]] if flags else None,
        prerequisite=isinstance(line, base.Prerequisite),
        live=live,
    )


def job_warnings(job: Job, backend: base.Scheduler) -> list[str]:
    """What is allowed but most likely not meant: a built-in recipe's --synthetic epoch on CPUs (hours); a job the
    backend gives GPUs (Scheduler.uses_gpus: whole ones or its own kind of GPU share) is not warned."""
    r, recipe = job.spec.resources, job.submission.recipe
    if recipe is None or backend.uses_gpus(job.spec):
        return []
    from hpctrain.recipes import synthetic_cpu_warning

    processes = r.nodes * r.nproc_per_node  # a single-process launcher asks for 1 x 1
    warning = synthetic_cpu_warning(recipe, processes * r.cpus_per_task)
    return [base.WARNING_PREFIX + warning] if warning else []


def preview(job: Job, backend: base.Scheduler | None = None) -> base.Rendered:
    """The exact script or manifest `submit` would send (pure: the backend's render); what the scheduler cannot
    express is a UserError here, before anything is checked or sent."""
    return (backend or job.backend()).render(job.spec)


def check(
    job: Job,
    live: bool = True,
    here: bool = False,
    backend: base.Scheduler | None = None,
    rendered: base.Rendered | None = None,
) -> list[Problem]:
    """Every problem with `job`, in the order a face says them: what is allowed but likely not meant, this
    environment's own (`here`: an installed numpy its torch was not built for), then what the submit host can
    tell (paths, programs, a recipe's data), then (`live`) what the live cluster says. The job is rendered first
    (unless `rendered` is its preview): what the scheduler cannot express is a UserError."""
    backend = backend or job.backend()
    if rendered is None:
        preview(job, backend)
    lines = job_warnings(job, backend) + (here_warnings() if here else [])
    from hpctrain.recipes import check_data  # run by the backend where it sees the data (it may not import it)

    lines += backend.local_check(job.spec, job.submission.recipe, check_data=check_data)
    if job.submission.resources_only:  # what is said about the placeholder command is not the user's concern
        lines = [p for p in lines if not p.startswith(base.NOTE_PREFIX)]
    options = _flag_dests()
    problems = [problem(line, options=options) for line in lines]
    if live:
        problems += [problem(line, live=True, options=options) for line in backend.check(job.spec)]
    return problems


def here_warnings() -> list[str]:
    """This environment's own problems, whatever the job: an installed NumPy its torch was not built for (the job's
    own when it runs this environment). Asked before the backend is made, whose client may not import here."""
    from hpctrain.compat import installed_numpy_mismatch

    mismatch = installed_numpy_mismatch()
    return [f"{base.WARNING_PREFIX}here, {mismatch}"] if mismatch else []


@dataclass(frozen=True)
class Submitted:
    """A job the scheduler took: its id, the scheduler, where its run directory is (None where it has none this
    machine reads), what the backend said of it (where it is recorded, how to follow it), and its description as
    recorded (job.yaml: resubmit it with --job-file, or clone it in the web form)."""

    job_id: str
    scheduler: str
    run_dir: str | None
    said: tuple[str, ...]
    description: dict[str, Any] = field(default_factory=dict)


class Refused(UserError):
    """`submit` found problems that block the job: nothing was sent."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(p.line for p in problems if p.blocking) + "; nothing was submitted")


def submit(
    job: Job,
    problems: list[Problem] | None = None,
    live: bool = True,
    backend: base.Scheduler | None = None,
    rendered: base.Rendered | None = None,
) -> Submitted:
    """Check `job` (unless `problems` are those of a check just made), refuse it (Refused) when anything blocks,
    else render it, send it and record it in its run directory."""
    backend = backend or job.backend()
    problems = check(job, live=live, backend=backend, rendered=rendered) if problems is None else problems
    if any(p.blocking for p in problems):
        raise Refused(problems)
    rendered = rendered or preview(job, backend)
    job_id = backend.submit(job.spec, rendered)
    description = describe(job.submission)
    said = backend.record(job.spec, rendered, job_id, description)
    run_dir = job.spec.run_dir.replace("%j", job_id) if job.spec.run_dir else None
    return Submitted(job_id=job_id, scheduler=job.scheduler, run_dir=run_dir, said=tuple(said), description=description)


def describe(submission: Submission) -> dict[str, Any]:
    """job.yaml: the job as a job file (resubmit with --job-file), with the backend's options in its section."""
    description = submission.job.to_dict()
    if submission.job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    description["scheduler"] = submission.scheduler
    if submission.options:
        description[submission.scheduler] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in submission.options.items()
        }
    return description


@dataclass(frozen=True)
class ResumePlan:
    """How to continue a job's run directory: the job flags and the job file text `build` takes, and the
    directory the job ran in (its first attempt's, from provenance.json; None where unknown), from which the
    relative paths of its command and job file are meant."""

    flags: dict[str, Any]
    job_file_text: tuple[str, str]
    directory: str | None = None


def resume_plan(backend: base.Scheduler, job_id: str) -> ResumePlan:
    """The plan that continues `job_id`'s run directory, as the CLI's resume path has it (resume_flags), from the
    directory the job ran in. A run directory not readable here, a job.yaml without a command, or a recipe's run
    directory with no checkpoint is a UserError that says so."""
    text = recorded(backend, job_id)
    run_dir = Path(backend.services().run_dir(job_id) or "")
    flags = resume_flags(run_dir, text)
    if flags is None:
        raise UserError(f"job {job_id}: {run_dir / 'job.yaml'} holds no command, so there is nothing to resume")
    from hpctrain.checkpoint import candidates
    from hpctrain.training.rundir import checkpoint_dir

    if "job_command" in flags and not candidates(checkpoint_dir(run_dir)):
        raise UserError(
            f"--resume {run_dir}: there is no checkpoint in {checkpoint_dir(run_dir)}; nothing to continue: clone "
            f"job {job_id} to start it again"
        )
    return ResumePlan(flags, (str(run_dir / "job.yaml"), text), _recorded_first_directory(run_dir))


def resume_flags(run_dir: Path, job_file_text: str) -> dict[str, Any] | None:
    """The job flags that continue `run_dir`, given its job file (job.yaml's text): `hpctrain submit --job-file
    RUN_DIR/job.yaml train WORKLOAD [its options] --run-dir RUN_DIR --resume` for a built-in recipe (the newest valid
    checkpoint there), `--job-file RUN_DIR/job.yaml --run-dir RUN_DIR` for a program of one's own (it resumes from its
    run directory itself). None where the file holds no command. The job page's resume line is made from it too."""
    import yaml

    try:
        data = yaml.safe_load(job_file_text)
    except yaml.YAMLError:
        return None
    command = data.get("command") if isinstance(data, dict) else None
    if not (isinstance(command, list) and command and all(isinstance(word, str) for word in command)):
        return None
    if command[:2] != ["hpctrain", "train"]:
        return {"run_dir": str(run_dir)}
    return {"job_command": [*command[1:], "--run-dir", str(run_dir), "--resume"]}


def first_directory(attempts: list[dict[str, Any]]) -> str | None:
    """The directory the run's first attempt ran in (provenance.json's attempts), where one is recorded as an
    absolute path: where the job's relative paths are meant from."""
    where = attempts[0].get("cwd") if attempts else None
    return where if isinstance(where, str) and where.startswith("/") else None


def resume(plan: ResumePlan) -> Submitted:
    """Check and submit the plan's job from the directory its job ran in, as `cd DIR && hpctrain submit ...` would:
    its relative paths (a `--data-dir data`, an `--output`) are checked and the job started there. A face that is a
    threaded server cannot change its own working directory, so where that directory is another one (and exists
    here) a child process (spawned: a fresh interpreter, no thread of this one) does it and sends back the job or
    the one line that refused it."""
    here = Path.cwd()
    there = Path(plan.directory) if plan.directory else None
    if there is None or not there.is_dir() or there.resolve() == here.resolve():
        return submit(build(plan.flags, job_file_text=plan.job_file_text))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # An executor, not a multiprocessing Pool: a child that dies (killed, out of memory) is an error here, where a
    # Pool would start another worker and wait for the lost task for ever.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            kind, value = pool.submit(_resume_in, plan).result()
        except BrokenProcessPool:
            raise UserError(
                f"the process that submits from {there} ended without an answer: see `hpctrain status` for whether "
                f"a job was queued, then resume it from there with the command the job's page shows"
            ) from None
    if kind == "refused":
        raise UserError(value)
    return value


def _resume_in(plan: ResumePlan) -> tuple[str, Any]:
    """resume() in a child process: in the plan's directory, ("submitted", Submitted) or ("refused", its line)."""
    import os

    try:
        os.chdir(str(plan.directory))
        return "submitted", submit(build(plan.flags, job_file_text=plan.job_file_text))
    except UserError as err:
        return "refused", str(err)


def _recorded_first_directory(run_dir: Path) -> str | None:
    """first_directory of the run's provenance.json, or None where there is no readable one."""
    from hpctrain.readback import BadRunFile
    from hpctrain.training.provenance import read_attempts

    try:
        return first_directory(read_attempts(run_dir))
    except (BadRunFile, OSError):
        return None


def recorded(backend: base.Scheduler, job_id: str) -> str:
    """The description a job was submitted with (job.yaml in its run directory, read back as untrusted), as job
    file text: what `--job-file` takes and the web form's clone fills in."""
    import yaml

    from hpctrain.jobs.file_reading import read_job_record

    run_dir = backend.services().run_dir(job_id)
    if run_dir is None:
        raise UserError(f"job {job_id}: its run directory is not readable here, so its description is unknown")
    record = Path(run_dir) / "job.yaml"
    if not record.is_file():
        raise UserError(f"job {job_id}: {record} does not exist (was it submitted by hpctrain submit?)")
    data = read_job_record(record, within=Path(run_dir))
    return yaml.safe_dump(data, sort_keys=False)
