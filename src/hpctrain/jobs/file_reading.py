"""Reading a job file (YAML, TOML, or a Kubernetes platform's key=value .params file) into plain data, refusing
anything that could make the read itself costly.

A job file is a few lines written by a person. What is refused here, each with a one-line UserError:
what is not a regular file (a FIFO; /dev/zero behind a link), files above MAX_JOB_FILE_BYTES, text that is not
UTF-8 (all three for .params files too), YAML anchors and aliases (nested aliases expand a few hundred bytes into
gigabytes: "billion laughs"), nesting so deep that the parsers recurse out of the stack, and numbers of more digits
than Python converts (4,300).
`mapping.from_mapping` validates the job data that comes back.

Besides the JobSpec keys, a YAML/TOML job file may name its scheduler and hold a section of that scheduler's
options: hpctrain.schedulers.job_sections splits them off, and reads a backend's own format (a .params file) with
read_job_text's checks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli package (a dependency there)
    import tomli as tomllib

from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, format_bytes, read_regular

MAX_JOB_FILE_BYTES = 1 << 20
SUFFIXES = (".toml", ".yaml", ".yml")
PARAMS_SUFFIX = ".params"


def _job_yaml_loader():
    """PyYAML's SafeLoader, minus YAML 1.1's base-60 numbers (`time: 30:00` must stay the string "30:00"),
    and refusing anchors, aliases and a key given twice."""
    import yaml

    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"

    class JobLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    "YAML anchors (&name) and aliases (*name) are not allowed in a job file; write the values out",
                    event.start_mark,
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            # PyYAML keeps the last of two equal keys; a job file with `nodes:` twice is a mistake to point out.
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is given twice: keep one", key_node.start_mark
                    )
            return super().construct_mapping(node, deep=deep)

    JobLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (int_tag, float_tag)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    JobLoader.add_implicit_resolver(int_tag, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
    JobLoader.add_implicit_resolver(
        float_tag, re.compile(r"^[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?$"), list("-+0123456789.")
    )
    return JobLoader


def read_job_bytes(path: Path) -> bytes:
    """The bytes of a job file (any format): a regular file of at most MAX_JOB_FILE_BYTES, else a UserError."""
    try:
        return read_regular(path, MAX_JOB_FILE_BYTES)
    except FileRefused as err:
        if err.reason.startswith("not a regular file"):
            raise UserError(f"job file {path}: {err.reason}; check the --job-file path") from None
        raise UserError(
            f"job file {path} is larger than {format_bytes(MAX_JOB_FILE_BYTES)}, far more than a job description "
            "needs; check the --job-file path"
        ) from None
    except OSError as err:
        raise UserError(f"cannot read job file {path}: {err.strerror or err}; check the --job-file path") from err


def read_job_text(path: Path) -> str:
    """The UTF-8 text of a job file (read_job_bytes' checks, then the decoding), else a UserError."""
    data = read_job_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"job file {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); save it as UTF-8"
        ) from None


def _parse(path: Path, text: str) -> Any:
    try:
        if path.suffix == ".toml":
            try:
                return tomllib.loads(text)
            except tomllib.TOMLDecodeError as err:
                raise UserError(f"job file {path} is not valid TOML: {err}") from None
        import yaml

        try:
            return yaml.load(text, Loader=_job_yaml_loader())  # a SafeLoader subclass
        except yaml.YAMLError as err:
            raise UserError(f"job file {path} is not valid YAML: {_one_line(err)}") from None
    except ValueError as err:  # a number the parser could not convert: Python's limit on an integer's digits
        digits = re.search(r"value has (\d+) digits", str(err))
        what = f"a number of {digits[1]} digits" if digits else f"a value that cannot be read ({_one_line(err)[:200]})"
        raise UserError(
            f"job file {path} holds {what}: no job option is anywhere near that large; check the file"
        ) from None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def load_job_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) job file into plain data; job.from_mapping validates it."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UserError(
            f"job file {path}: name it .yaml, .yml or .toml so its format is clear "
            f"(or {PARAMS_SUFFIX} for a Kubernetes platform's key=value params file)"
        )
    text = read_job_text(path)
    try:
        data = _parse(path, text)
    except RecursionError:
        raise UserError(
            f"job file {path} nests lists or tables too deeply to read; a job file needs a few levels at most"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"job file {path}: expected a mapping of job options at the top level")
    return data


def read_job_record(path: Path, within: Path) -> Any:
    """A job.yaml that `hpctrain submit` left in a run directory, read back as untrusted (readback's bounds: a
    regular file, no link below `within`, at most MAX_JOB_FILE_BYTES of UTF-8) and parsed as a job file is (no
    anchors or aliases). A UserError (readback.BadRunFile among them) for a record that cannot be used."""
    from hpctrain.readback import read_text

    text = read_text(path, MAX_JOB_FILE_BYTES, within=within)
    try:
        return _parse(path, text)
    except RecursionError:
        raise UserError(f"{path} nests too deeply to be a job record") from None
