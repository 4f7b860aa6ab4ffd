"""What hpctrain reads of each kind of API object, and what each field must be for the use it is put to.

The views and checks read the API server's JSON as dicts (rest.py) and take a few fields of each object: a pod's
phase, its containers' restart counts and exit codes, a node's allocatable resources, a job's conditions. A server
(or a proxy, or a broken controller) may send any JSON there: a string where a count belongs, a list where an
object does, 1e999, a lone surrogate that no terminal or file can take. Every object read is held here, once, to the
shape of the fields its readers use (`SHAPES`, by the resource named in the request's path), so that what the
readers get is what they assume: an object is a dict, a list a list, a string a str that encodes as UTF-8, a
whole number an int within its Kubernetes type (int32), a quantity a string or a finite number. A field that is
absent (or null) is allowed: every reader has its default. `problem(resource, obj)` says what is wrong, naming the
object and the field; answers.json_answer makes that the command's one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

INT32 = (-(2**31), 2**31 - 1)


class Text:
    """A string that encodes as UTF-8 (no lone surrogate from a `\\ud800` escape)."""


class Whole:
    """A whole number (not a boolean) within int32."""


class Flag:
    """true or false."""


class Quantity:
    """A resource quantity: a string (`500m`, `16Gi`), or a number; options.parse_quantity reads it."""


class Anything:
    """Read by code that checks what it finds (a CRD's schema)."""


TEXT, WHOLE, FLAG, QUANTITY, ANY = Text(), Whole(), Flag(), Quantity(), Anything()


class MapOf:
    """An object of any keys, each value of one shape (labels, resource lists)."""

    def __init__(self, value: Any) -> None:
        self.value = value


META = {
    "name": TEXT,
    "namespace": TEXT,
    "uid": TEXT,
    "labels": MapOf(TEXT),
    "annotations": MapOf(TEXT),
    "creationTimestamp": TEXT,
    "deletionTimestamp": TEXT,
}
RESOURCES = {"requests": MapOf(QUANTITY), "limits": MapOf(QUANTITY)}
CONTAINER = {"name": TEXT, "resources": RESOURCES}
CONDITIONS = [{"type": TEXT, "status": TEXT, "reason": TEXT, "message": TEXT}]
ENDED = {"exitCode": WHOLE, "reason": TEXT, "message": TEXT}
CONTAINER_STATE = {"terminated": ENDED, "waiting": {"reason": TEXT, "message": TEXT}, "running": {}}
SHAPES: dict[str, dict[str, Any]] = {
    "pods": {
        "spec": {"nodeName": TEXT, "containers": [CONTAINER], "initContainers": [CONTAINER]},
        "status": {
            "phase": TEXT,
            "reason": TEXT,
            "message": TEXT,
            "conditions": CONDITIONS,
            "containerStatuses": [
                {"name": TEXT, "restartCount": WHOLE, "state": CONTAINER_STATE, "lastState": CONTAINER_STATE}
            ],
        },
    },
    "nodes": {
        "spec": {"unschedulable": FLAG, "taints": [{"key": TEXT, "value": TEXT, "effect": TEXT}]},
        "status": {"allocatable": MapOf(QUANTITY)},
    },
    "pytorchjobs": {
        "spec": {"pytorchReplicaSpecs": MapOf({"replicas": WHOLE})},
        "status": {"conditions": CONDITIONS},
    },
    "trainjobs": {
        "spec": {"trainer": {"numNodes": WHOLE}},
        "status": {"conditions": CONDITIONS, "jobsStatus": [{"name": TEXT, "ready": WHOLE}]},
    },
    "events": {
        "involvedObject": {"name": TEXT, "kind": TEXT},
        "type": TEXT,
        "reason": TEXT,
        "message": TEXT,
        "lastTimestamp": TEXT,
        "eventTime": TEXT,
    },
    "resourcequotas": {"spec": {"hard": MapOf(QUANTITY)}, "status": {"hard": MapOf(QUANTITY), "used": MapOf(QUANTITY)}},
    "priorityclasses": {"value": WHOLE},
    "persistentvolumeclaims": {"spec": {"accessModes": [TEXT]}},
    "customresourcedefinitions": {
        "spec": {"versions": [{"name": TEXT, "served": FLAG, "schema": {"openAPIV3Schema": ANY}}]},
        "status": {"conditions": CONDITIONS},
    },
}


def problem(resource: str | None, obj: dict[str, Any]) -> str | None:
    """What in `obj` (one object of `resource`, e.g. `pods`) does not fit what hpctrain reads of it: `pod NAME:
    status.containerStatuses[0].restartCount is a string ('3'), not a whole number`; None when it fits."""
    if _fitting(resource or "")(obj):
        return None
    shape = {"metadata": META, **SHAPES.get(resource or "", {})}
    why = _check(shape, obj, "") or "does not fit"
    name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    kind = (resource or "object").removesuffix("s") if resource != "priorityclasses" else "priorityclass"
    named = f"{kind} {_brief(name)}" if isinstance(name, str) and _encodes(name) else kind
    return f"{named}: {why}"


@functools.lru_cache(maxsize=None)
def _fitting(resource: str) -> Callable[[Any], bool]:
    """Whether an object of `resource` fits its shape, as one function made of closures: a 40,000-pod `cluster`
    checks every pod, and walking the shape (and naming each field's path) for each cost 0.03 ms a pod. `_check`
    says why, for the one that does not fit."""
    return _compiled({"metadata": META, **SHAPES.get(resource, {})})


def _compiled(shape: Any) -> Callable[[Any], bool]:
    """A function telling whether a value (None allowed) fits `shape`. An object's leaves are tested inline, a
    kind at a time, and its text first as ASCII (what nearly all of it is): a function call per field was most of
    the cost."""
    if isinstance(shape, dict):
        leaves = {kind: tuple(k for k, v in shape.items() if v is kind) for kind in (TEXT, WHOLE, FLAG, QUANTITY)}
        texts, wholes, flags, quantities = leaves[TEXT], leaves[WHOLE], leaves[FLAG], leaves[QUANTITY]
        nested = tuple(
            (k, _compiled(v)) for k, v in shape.items() if not isinstance(v, (Text, Whole, Flag, Quantity, Anything))
        )
        lo, hi = INT32

        def fits_object(value: Any) -> bool:
            if value is None:
                return True
            if type(value) is not dict:
                return False
            get = value.get
            for key in texts:
                item = get(key)
                if item is not None and not (type(item) is str and (item.isascii() or _encodes(item))):
                    return False
            for key in wholes:
                item = get(key)
                if item is not None and not (type(item) is int and lo <= item <= hi):
                    return False
            for key in flags:
                item = get(key)
                if item is not None and type(item) is not bool:
                    return False
            for key in quantities:
                item = get(key)
                if item is not None and not _fits_quantity(item):
                    return False
            for key, fits in nested:
                item = get(key)
                if item is not None and not fits(item):
                    return False
            return True

        return fits_object
    if isinstance(shape, list):
        fits_item = _compiled(shape[0])

        def fits_list(value: Any) -> bool:
            return value is None or (type(value) is list and all(map(fits_item, value)))

        return fits_list
    if isinstance(shape, MapOf):
        if shape.value is TEXT or shape.value is QUANTITY:  # labels, resource lists: strings, nearly always ASCII
            fits_one = _fits_quantity if shape.value is QUANTITY else _fits_text

            def fits_strings(value: Any) -> bool:
                if value is None:
                    return True
                if type(value) is not dict:
                    return False
                if all(type(k) is str and k.isascii() for k in value) and all(
                    type(v) is str and v.isascii() for v in value.values()
                ):
                    return True
                return all(map(_fits_text, value)) and all(v is None or fits_one(v) for v in value.values())

            return fits_strings
        fits_value = _compiled(shape.value)

        def fits_map(value: Any) -> bool:
            return value is None or (
                type(value) is dict and all(map(_fits_text, value)) and all(map(fits_value, value.values()))
            )

        return fits_map
    if shape is ANY:
        return lambda value: True
    return lambda value: _check(shape, value, "") is None


def _fits_text(value: Any) -> bool:
    return type(value) is str and (value.isascii() or _encodes(value))


def _fits_quantity(value: Any) -> bool:
    return _fits_text(value) or type(value) in (int, float)


def _check(shape: Any, value: Any, where: str) -> str | None:
    if value is None:
        return None  # absent or null: every reader has its default
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'the object'} is {_kind(value)}, not an object"
        for key, inner in shape.items():
            if key in value and (why := _check(inner, value[key], f"{where}.{key}" if where else key)):
                return why
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_kind(value)}, not a list"
        for i, item in enumerate(value):
            if why := _check(shape[0], item, f"{where}[{i}]"):
                return why
        return None
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            return f"{where} is {_kind(value)}, not an object"
        for key, item in value.items():
            if not _encodes(key):
                return f"{where} has a key that is not text (a lone surrogate)"
            if why := _check(shape.value, item, f"{where}[{_brief(key)}]"):
                return why
        return None
    if shape is TEXT:
        if not isinstance(value, str):
            return f"{where} is {_kind(value)}, not a string"
        return None if _encodes(value) else f"{where} is not text (a lone surrogate)"
    if shape is WHOLE:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{where} is {_kind(value)}, not a whole number"
        lo, hi = INT32
        return None if lo <= value <= hi else f"{where} is {value}, outside int32"
    if shape is FLAG:
        return None if isinstance(value, bool) else f"{where} is {_kind(value)}, not true or false"
    if shape is QUANTITY:
        if isinstance(value, str):
            return None if _encodes(value) else f"{where} is not text (a lone surrogate)"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return None  # json_answer reads no number that is not finite
        return f"{where} is {_kind(value)}, not a quantity"
    return None  # ANY


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({_brief(value)})"
    if isinstance(value, str):
        return f"a string ({_brief(value)})"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _brief(value: Any) -> str:
    text = ascii(value) if not isinstance(value, str) or not _encodes(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
