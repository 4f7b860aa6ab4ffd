"""The job form (`/jobs/new`): its fields made from the parser of `hpctrain submit`'s job flags
(hpctrain.engine.submission.job_parser: the common flags and each backend's, in their `--help` groups, with their
help text), and what was typed made into those flags again by that parser, so that a bad value gets the words the
CLI says. There is no second list of fields: a flag a backend adds is a field here.

What runs is a built-in recipe (`train WORKLOAD [its options]`) or the user's own command (after `--`); a job
file (YAML, TOML or a params file) pasted or loaded into the form fills the job as `--job-file` does, the fields on
top. Every value here is the user's own, sent back to them escaped by the templates' autoescape.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain.engine import submission
from hpctrain.errors import UserError
from hpctrain.recipes.catalog import CATALOG

# Not fields: the command (its own part of the form) and the job file (the import box).
OWN_PARTS = {"job_command", "job_file"}
JOB_FILE_TEXT, JOB_FILE_NAME = "job_file_text", "job_file_name"
WHAT, RECIPE, RECIPE_OPTIONS, COMMAND = "what", "recipe", "recipe_options", "command"
ACTIONS = ("check", "preview", "submit")


@dataclass(frozen=True)
class Field:
    name: str
    """The flag's dest: the form field's name, and what a Problem's field names."""
    flag: str
    help: str
    kind: str
    """text, number, choice, check (a flag without value) or lines (a repeatable flag: one value a line)."""
    choices: tuple[str, ...] = ()
    metavar: str = ""


@dataclass(frozen=True)
class Group:
    title: str
    fields: tuple[Field, ...]


def parser_for(schedulers: list[str]) -> argparse.ArgumentParser:
    """The job flags of the console's schedulers: the common ones and those backends' own."""
    return submission.job_parser(schedulers)


def groups(parser: argparse.ArgumentParser) -> list[Group]:
    """The job flags' `--help` groups as the form's sections, each flag a field with its help text."""
    found = []
    for group in parser._action_groups:
        fields = tuple(_field(a) for a in group._group_actions if a.option_strings and a.dest not in OWN_PARTS)
        if fields:
            found.append(Group(title=group.title or "", fields=fields))
    return found


def _field(action: argparse.Action) -> Field:
    flag = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
    help_text = (action.help or "").replace("%%", "%")
    if action.nargs == 0:
        kind = "check"
    elif isinstance(action, argparse._AppendAction):
        kind = "lines"
    elif action.choices:
        kind = "choice"
    elif action.type in (int, float):
        kind = "number"
    else:
        kind = "text"
    choices = tuple(str(c) for c in action.choices) if action.choices else ()
    return Field(action.dest, flag, help_text, kind, choices, str(action.metavar or ""))


@dataclass
class FormInput:
    """What the form holds: each field's text as typed, the command part and the job file box."""

    values: dict[str, str] = field(default_factory=dict)
    what: str = "recipe"
    """recipe, command, or file (the job file says what runs)."""
    recipe: str = next(iter(CATALOG))
    recipe_options: str = ""
    command: str = ""
    job_file_name: str = ""
    job_file_text: str = ""

    @classmethod
    def from_form(cls, form: dict[str, list[str]], parser: argparse.ArgumentParser) -> FormInput:
        def one(name: str, default: str = "") -> str:
            return (form.get(name) or [default])[-1]

        fields = {f.name for g in groups(parser) for f in g.fields}
        return cls(
            values={k: one(k) for k in form if k in fields},
            what=one(WHAT, "recipe"),
            recipe=one(RECIPE, next(iter(CATALOG))),
            recipe_options=one(RECIPE_OPTIONS),
            command=one(COMMAND),
            job_file_name=one(JOB_FILE_NAME),
            job_file_text=one(JOB_FILE_TEXT),
        )

    def argv(self, parser: argparse.ArgumentParser) -> list[str]:
        """The job flags as `hpctrain submit` would be given them."""
        argv: list[str] = []
        for group in groups(parser):
            for f in group.fields:
                text = self.values.get(f.name, "").strip()
                if not text:
                    continue
                if f.kind == "check":
                    argv.append(f.flag)
                elif f.kind == "lines":
                    argv += [f"{f.flag}={item.strip()}" for item in text.splitlines() if item.strip()]
                else:
                    argv.append(f"{f.flag}={text}")
        return argv

    def job_command(self) -> list[str]:
        """`train WORKLOAD OPTIONS...`, or `-- COMMAND...`; empty where the job file says what runs."""
        try:
            if self.what == "command":
                words = shlex.split(self.command)
                return ["--", *words] if words else []
            if self.what != "recipe":
                return []
            if self.recipe not in CATALOG:
                raise UserError(f"recipe {self.recipe!r} is unknown: choose one of {', '.join(CATALOG)}")
            return ["train", self.recipe, *shlex.split(self.recipe_options)]
        except ValueError as err:  # shlex: an unclosed quote
            raise UserError(f"the command: {err} (quote as a shell would)") from None

    def job(self, parser: argparse.ArgumentParser) -> submission.Job:
        """The job this form describes, through the engine (a UserError, the CLI's words, for bad input)."""
        flags = submission.flags_from_argv(self.argv(parser), parser)
        command = self.job_command()
        if command:
            flags["job_command"] = command
        text = self.job_file_text.strip()
        job_file = (self.job_file_name.strip() or "job.yaml", self.job_file_text) if text else None
        return submission.build(flags, job_file_text=job_file)


def new_form(scheduler: str, connection: Mapping[str, str]) -> FormInput:
    """An empty form for `scheduler`, its connection fields (Scheduler.connection: a namespace, a context) filled
    with the console's: what the console shows is where the job goes."""
    return FormInput(values={"scheduler": scheduler, **connection})


def from_record(text: str, connection: Mapping[str, str] | None = None) -> FormInput:
    """A form filled with a job's recorded description (its job.yaml), to submit again as it was or changed, the
    connection fields with the console's."""
    return FormInput(values=dict(connection or {}), what="file", job_file_name="job.yaml", job_file_text=text)


def elsewhere(
    scheduler: str, job_place: Mapping[str, str], console_place: Mapping[str, str], parser: argparse.ArgumentParser
) -> str | None:
    """Why a job would go somewhere other than where the console shows `scheduler`'s jobs (another namespace,
    context or kind of job: its page would not find it), as one line naming the field and the fix; None when it
    goes there. `job_place`, `console_place`: Scheduler.connection() of the job's backend and of the console's."""
    flags = {a.dest: next((o for o in a.option_strings if o.startswith("--")), a.dest) for a in parser._actions}
    for dest in sorted(set(job_place) | set(console_place)):
        if job_place.get(dest) == console_place.get(dest):
            continue
        flag = flags.get(dest, dest)
        said = job_place.get(dest) or "left empty"
        here = " ".join(f"{flags.get(k, k)} {v}" for k, v in console_place.items())
        wanted = console_place.get(dest)
        fix = f"give {flag} {wanted}" if wanted else f"leave {flag} empty"
        return (
            f"{flag} {said}: this console shows the {scheduler} jobs at {here}, and would not find this one: "
            f"{fix}, or start `hpctrain web --scheduler {scheduler}` with {flag} {job_place.get(dest) or '...'} "
            "to send jobs there"
        )
    return None


def problems_by_field(
    problems: list[submission.Problem], parser: argparse.ArgumentParser
) -> tuple[dict[str, list[Any]], list[Any]]:
    """The problems beside their field, and those that name none (shown above the form)."""
    fields = {f.name for g in groups(parser) for f in g.fields}
    beside: dict[str, list[Any]] = {}
    rest = []
    for p in problems:
        if p.field in fields:
            beside.setdefault(p.field, []).append(p)
        else:
            rest.append(p)
    return beside, rest
