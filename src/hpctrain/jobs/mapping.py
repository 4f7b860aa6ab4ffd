"""Building a JobSpec from plain data: a job file's mapping and/or CLI flags, keys as in VALID_KEYS (a backend's
options, e.g. a Slurm partition, are its own: hpctrain.schedulers.job_sections and the CLI take them out first).

Unknown keys and wrong types are UserErrors that name the key and the fix (and list the valid keys); a null
value means "the default", so what `JobSpec.to_dict` writes reads back unchanged. The values themselves are
then checked by the JobSpec dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from hpctrain.errors import UserError, brief
from hpctrain.jobs.spec import ENVIRONMENT_KINDS, EnvironmentSpec, JobSpec, Resources
from hpctrain.jobs.values import parse_gres, parse_nodes

_RESOURCE_KEYS = {f.name for f in fields(Resources)} - {"min_nodes"}  # a job file writes `nodes: MIN:MAX`
_ENV_KEYS = {f.name for f in fields(EnvironmentSpec)}
_JOB_KEYS = {f.name for f in fields(JobSpec)} - {"resources", "environment"}
VALID_KEYS = sorted(_JOB_KEYS | _RESOURCE_KEYS | {"environment", "gres"})
_INT_KEYS = {
    "nproc_per_node",
    "gpus_per_node",
    "shards_per_node",
    "cpus_per_task",
    "signal_grace",
    "max_hang_restarts",
    "max_restarts",
}
_STR_KEYS = {"name", "time", "run_dir", "gpu_type", "mem", "gres", "python"}
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
    if "time" in data and isinstance(data["time"], int):
        data["time"] = str(data["time"])  # a bare number is minutes, as sbatch reads it
    if "mem" in data and isinstance(data["mem"], int):
        data["mem"] = str(data["mem"])
    res = {k: data.pop(k) for k in list(data) if k in _RESOURCE_KEYS}
    if "nodes" in res:
        res["min_nodes"], res["nodes"] = parse_nodes(res["nodes"])
    gres = data.pop("gres", None)
    if gres is not None:
        if any(k in res for k in ("gpus_per_node", "gpu_type", "shards_per_node")):
            raise UserError(f"{source}: give gres or gpus_per_node/gpu_type/shards_per_node, not both")
        res["gpus_per_node"], res["gpu_type"], res["shards_per_node"] = parse_gres(gres)
    env_data = data.pop("environment", None)
    if env_data is not None:
        data["environment"] = _environment_from(source, env_data)
    if "env" in data:
        data["env"] = tuple((str(k), _env_value(source, k, v)) for k, v in data["env"].items())
    for key in _LIST_KEYS & set(data):
        data[key] = tuple(data[key])
    data.setdefault("command", ())
    return JobSpec(resources=Resources(**res), **data)


def _environment_from(source: str, value: Any) -> EnvironmentSpec:
    if isinstance(value, str):
        return EnvironmentSpec(kind=value)
    if not isinstance(value, dict):
        raise UserError(
            f"{source}: environment must be a kind ({', '.join(ENVIRONMENT_KINDS)}) or a mapping with "
            f"keys {', '.join(sorted(_ENV_KEYS))}"
        )
    data = known_keys(value, _ENV_KEYS, f"{source}: unknown environment key(s)")
    for key in ("modules", "mounts"):
        if key in data:
            if isinstance(data[key], str):
                data[key] = [data[key]]
            if not isinstance(data[key], list) or not all(isinstance(v, str) for v in data[key]):
                raise UserError(f"{source}: environment.{key} must be a list of strings (got {brief(data[key])})")
            data[key] = tuple(data[key])
    for key in ("kind", "conda_env", "venv", "image", "workdir"):
        if key in data and not isinstance(data[key], str):
            raise UserError(f"{source}: environment.{key} must be a string (got {brief(data[key])})")
    return EnvironmentSpec(**data)


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
