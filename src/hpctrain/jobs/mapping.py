"""Building a JobSpec from plain data: a job file's mapping and/or CLI flags, keys as in VALID_KEYS (a backend's
options, e.g. a Slurm partition or a Kubernetes image, are its own: hpctrain.schedulers.job_sections, the backend's
BackendInfo and the CLI take them out first, so a job file and a params file fill the same two parts).

Unknown keys and wrong types are UserErrors that name the key and the fix (and list the valid keys); a null
value means "the default", so what `JobSpec.to_dict` writes reads back unchanged. The values themselves are
then checked by the JobSpec dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from hpctrain.errors import UserError, brief
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import parse_mem_bytes, parse_nodes, parse_time_limit

# A job file writes `nodes: MIN:MAX`, `mem: 16G` and `time: 30:00`: the forms people type, read into numbers here.
_RESOURCE_KEYS = {f.name for f in fields(Resources)} - {"min_nodes", "mem_bytes"} | {"mem"}
_JOB_KEYS = {f.name for f in fields(JobSpec)} - {"resources", "time_limit_s"} | {"time"}
VALID_KEYS = sorted(_JOB_KEYS | _RESOURCE_KEYS)
_INT_KEYS = {"nproc_per_node", "gpus_per_node", "cpus_per_task", "signal_grace", "max_restarts"}
_STR_KEYS = {"name", "time", "run_dir", "mem"}
_LIST_KEYS = {"command", "exclude_nodes"}


def known_keys(values: dict[Any, Any], valid: Iterable[str], unknown_message: str) -> dict[str, Any]:
    """`values` with '-' in keys read as '_' and null values dropped (null means "the default"); keys outside
    `valid` are a UserError that starts with `unknown_message` and lists the valid ones."""
    valid = sorted(valid)
    data = {str(k).replace("-", "_"): v for k, v in values.items() if v is not None}
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise UserError(f"{unknown_message} {', '.join(unknown)}; valid keys: {', '.join(valid)}")
    return data


def from_mapping(values: dict[str, Any], source: str = "job") -> JobSpec:
    """Build a JobSpec from job-file data (keys as in VALID_KEYS; '-' may stand for '_'). Unknown keys and wrong
    types are UserErrors that name the key and the fix."""
    if not isinstance(values, dict):
        raise UserError(f"{source}: expected a mapping of job options (e.g. `nodes: 2`), got {type(values).__name__}")
    # A key set to null means "the default", so a written-out description (to_dict) reads back unchanged.
    data = known_keys(values, VALID_KEYS, f"{source}: unknown key(s)")
    for key, value in data.items():
        _check_type(source, key, value)
    if "time" in data:
        data["time_limit_s"] = parse_time_limit(str(data.pop("time")))  # a bare number is minutes
    res = {k: data.pop(k) for k in list(data) if k in _RESOURCE_KEYS}
    if "nodes" in res:
        res["min_nodes"], res["nodes"] = parse_nodes(res["nodes"])
    if "mem" in res:
        res["mem_bytes"] = parse_mem_bytes(str(res.pop("mem")))  # a bare number is megabytes
    if "env" in data:
        data["env"] = tuple((str(k), _env_value(source, k, v)) for k, v in data["env"].items())
    for key in _LIST_KEYS & set(data):
        data[key] = tuple(data[key])
    data.setdefault("command", ())
    return JobSpec(resources=Resources(**res), **data)


def _check_type(source: str, key: str, value: Any) -> None:
    def bad(expected: str) -> UserError:
        return UserError(f"{source}: {key} must be {expected} (got {brief(value)}, a {type(value).__name__})")

    if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("a whole number")
    if key == "nodes" and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise bad('a whole number, or "MIN:MAX" for an elastic job')
    if (
        key in _STR_KEYS
        and not isinstance(value, str)
        and not (key in ("time", "mem") and isinstance(value, int) and not isinstance(value, bool))
    ):
        raise bad("a string")
    if key in _LIST_KEYS and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
        raise bad("a list of strings")
    if key == "env" and not isinstance(value, dict):
        raise bad("a mapping of NAME: value")


def _env_value(source: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{source}: env.{key} must be a string or a number (got {brief(value)})")
    return str(value)
