"""A job file, split into the scheduler-neutral job and one backend's options: `scheduler:` names the backend, a
section named after it (`kubernetes:`) holds its options, and a backend's own format (a `.params` file) is always
for that backend. The safe reading of the file itself is hpctrain.jobs.file_reading's; which sections and formats exist
is what each backend's INFO declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.file_reading import load_job_file, read_job_text
from hpctrain.schedulers import SCHEDULERS, backend_info


@dataclass(frozen=True)
class JobFile:
    """A job file split into the scheduler-neutral job and the scheduler's own part."""

    job: dict[str, Any]
    """JobSpec fields, for jobs.mapping.from_mapping."""
    scheduler: str | None = None
    """The file's `scheduler:` (a backend's own format: that backend); None: not said."""
    options: dict[str, Any] = field(default_factory=dict)
    """The backend's options: its section (`kubernetes:`), or what its own format says."""
    section: str | None = None
    """The backend whose section the options came from (None: no section)."""


def read_job_file(path: str | Path) -> JobFile:
    """Read any job file: YAML/TOML (jobs.file_reading.load_job_file) or a backend's own format."""
    path = Path(path)
    for name in SCHEDULERS:
        parse = backend_info(name).file_formats.get(path.suffix)
        if parse is not None:
            job, options = parse(read_job_text(path), f"{path.suffix.lstrip('.')} file {path}")
            return JobFile(job=job, scheduler=name, options=options, section=name if options else None)
    data = {str(k).replace("-", "_"): v for k, v in load_job_file(path).items()}
    scheduler = data.pop("scheduler", None)
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise UserError(f"job file {path}: scheduler {scheduler!r} is unknown: use {' or '.join(SCHEDULERS)}")
    sections = {name: data.pop(name) for name in SCHEDULERS if name in data}
    if len(sections) > 1:
        raise UserError(f"job file {path} has sections for {' and '.join(sections)}; keep the one of its scheduler")
    if not sections:
        return JobFile(job=data, scheduler=scheduler)
    ((name, section),) = sections.items()
    read = backend_info(name).file_section
    if read is None:
        raise UserError(f"job file {path}: {name} has no options section; move its keys to the top level of the file")
    if scheduler is not None and scheduler != name:
        raise UserError(f"job file {path} says scheduler: {scheduler} but has a {name}: section; remove one of them")
    options = read(f"job file {path}", section)
    return JobFile(job=data, scheduler=scheduler, options=options, section=name if options else None)
