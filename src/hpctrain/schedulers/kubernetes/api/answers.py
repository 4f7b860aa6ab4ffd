"""What the API server answers, distrusted: an answer that is not the Kubernetes object asked for (HTML from a proxy's
login page, an empty body, JSON nested past Python's recursion limit, bytes that are not UTF-8, a list where an
object belongs, fields of the wrong type) ends the command with one line naming the server and what it answered,
never a traceback from the client's deserializer or from hpctrain's own reading of the object.

Two guards, both installed by client.harden and used by the backend's classes:

* `check_deserializing(api_client, server)`: the client's own decoding and model validation (pydantic) fail as one
  UserError; an answer to a custom-object call (PyTorchJob, TrainJob: plain dicts) must be a JSON object.
  `json_answer`: the same for an answer read as plain JSON (rest.py), without the client's models.
* `@guarded` on a class: an error of the wrong-shape kinds (TypeError, AttributeError, KeyError, IndexError,
  ValueError) raised in one of its public methods after an answer was read during the call is such an answer,
  worded as one line; raised before any answer, it is hpctrain's own and goes on as it is.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hpctrain.errors import UserError, brief
from hpctrain.schedulers.kubernetes.api import shapes

FIX = (
    "check that the cluster is up and that the kubeconfig names its API server (kubectl config view --minify), "
    "or pick another --context"
)

WRONG_SHAPE = (TypeError, AttributeError, KeyError, IndexError, ValueError, LookupError, RecursionError)
_HEAD = 120


@dataclass(frozen=True)
class Answer:
    server: str
    method: str
    path: str
    status: int
    content_type: str | None
    size: int
    head: bytes

    def described(self) -> str:
        kind = self.content_type or "no content type"
        body = f"{self.size} bytes: {brief(self.head.decode('utf-8', 'replace'), 80)}" if self.size else "an empty body"
        return f"to {self.method} {self.path}: HTTP {self.status}, {kind}, {body}"


class _Seen:
    """The answers read in this process: how many, and the last one (the one a reading error is about)."""

    count = 0
    last: Answer | None = None


SEEN = _Seen()


def note(server: str, method: str, url: str, status: int, headers: Any, data: bytes) -> None:
    """Called by the bounded pool for every answer read whole."""
    SEEN.count += 1
    SEEN.last = Answer(
        server, method, urlsplit(url).path or url, status, headers.get("content-type"), len(data), data[:_HEAD]
    )


def bad_answer(server: str | None, why: str) -> UserError:

    last = SEEN.last
    server = server or (last.server if last else "(unknown)")
    said = f" {last.described()}" if last is not None and last.server == server else ""
    return UserError(
        f"the Kubernetes API server {server} answered what is not a Kubernetes object ({why}){said}: "
        f"is it a Kubernetes API server (not a proxy or a login page)? {FIX}"
    )


def check_deserializing(api_client: Any, server: str) -> None:
    """Wrap the client's response_deserialize (see the module docstring); idempotent."""
    original = getattr(api_client, "response_deserialize", None)
    if original is None or getattr(original, "_hpctrain_checked", False):
        return  # None: the legacy generator's client (kubernetes < 35), which has no such step to wrap
    from kubernetes.client.exceptions import ApiException

    def response_deserialize(response_data: Any, response_types_map: dict[str, Any] | None = None) -> Any:
        types = response_types_map or {}
        try:
            result = original(response_data=response_data, response_types_map=types)
        except ApiException as err:
            if err.status == 0:  # the client's "Unsupported content type"
                raise bad_answer(server, brief(str(err.reason), 100)) from None
            raise
        except WRONG_SHAPE as err:
            raise bad_answer(server, f"{type(err).__name__}: {_first_line(err)}") from None
        status = str(response_data.status)
        expected = types.get(status) or types.get(status[:1] + "XX")
        if expected == "object" and not isinstance(result.data, dict):
            raise bad_answer(server, f"a JSON {_json_kind(result.data)} where an object belongs")
        if expected not in (None, "object", "str", "bytearray", "bytes", "file"):
            why = "null" if result.data is None else _nameless(result.data)
            if why:
                raise bad_answer(server, f"{why} where a {expected} belongs")
        return result

    response_deserialize._hpctrain_checked = True
    api_client.response_deserialize = response_deserialize


JSON_TYPE = re.compile(r"^application/(json|[\w!#$&.+\-^_]+\+json)\s*(;|$)", re.IGNORECASE)  # as the client's
CHARSET = re.compile(r"charset=([a-zA-Z\-\d]+)[\s;]?")


def json_answer(
    server: str, content_type: str | None, data: bytes, listing: bool, resource: str | None = None
) -> dict[str, Any]:
    """A successful answer read as JSON (rest.py), held to what the client's decoding and models demand of it: a
    JSON content type (or none) in a charset Python knows, a JSON object; a Kubernetes object with metadata and a
    name (its spec and status objects, if any), or (listing) a list whose items are such objects, with the list's
    own metadata an object. No number that is not finite (`1e999`, NaN). And each object of `resource` (`pods`,
    `nodes`, ...: the request's) holds the fields hpctrain reads of it in the type and range it reads them in
    (shapes.py)."""

    if content_type is not None and not JSON_TYPE.match(content_type):
        raise bad_answer(server, f"Unsupported content type: {brief(content_type, 60)}")
    charset = CHARSET.search(content_type or "")
    try:
        value = json.loads(
            data.decode(charset.group(1) if charset else "utf-8"), parse_float=_finite, parse_constant=_no_constant
        )
    except (ValueError, LookupError, RecursionError) as err:
        raise bad_answer(server, f"{type(err).__name__}: {_first_line(err)}") from None
    if not isinstance(value, dict):
        raise bad_answer(server, f"a JSON {_json_kind(value)} where an object belongs")
    if not listing:
        objects = [value]
    else:
        objects = value["items"] = value.get("items") or []  # a Go nil slice is null
        meta = value.get("metadata") or {}
        if not isinstance(objects, list) or not isinstance(meta, dict):
            raise bad_answer(server, "a list without items, or with metadata that is not an object")
        if not isinstance(meta.get("continue") or "", str):
            raise bad_answer(server, "a list whose continue token is not a string")
    for obj in objects:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            raise bad_answer(server, "an object without metadata")
        if not isinstance(meta.get("name"), str):
            raise bad_answer(server, "an object without a name")
        for part in ("spec", "status"):  # every kind read here has them as objects (a Status object is an error)
            if not isinstance(obj.get(part, {}), (dict, type(None))):
                raise bad_answer(server, f"an object whose {part} is a JSON {_json_kind(obj[part])}")
        why = shapes.problem(resource, obj)
        if why is not None:
            raise bad_answer(server, why)
    return value


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent, which must be finite: `1e999` is not a number a reader can use
    (int() of it raises OverflowError)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {brief(text, 40)} is out of range")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_kind(value: Any) -> str:
    return {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "list"}.get(
        type(value), type(value).__name__
    )


def _nameless(model: Any) -> str | None:
    """What a Kubernetes object (or each item of a list) lacks that every object a real server sends has: metadata
    with a name. (A list's own metadata has no name; a Status has none either.)"""
    items = getattr(model, "items", None)
    objects = items if isinstance(items, list) else [model]
    for obj in objects:
        if not hasattr(obj, "metadata"):
            continue
        meta = obj.metadata
        if meta is None:
            return "an object without metadata"
        if hasattr(meta, "generate_name") and not isinstance(getattr(meta, "name", None), str):
            return "an object without a name"
    return None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    text = " ".join(lines[0].split()) if lines else ""
    return text if len(text) <= 160 else text[:157] + "..."


def guarded(cls: type) -> type:
    """Every public method of `cls` (inherited ones included) reports a wrong-shaped answer as one line."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isfunction(attr):
            setattr(cls, name, _guard(attr))
    return cls


def _guard(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        before = SEEN.count
        try:
            result = method(*args, **kwargs)
        except WRONG_SHAPE as err:
            if SEEN.count == before or isinstance(err, UserError):
                raise
            raise bad_answer(None, f"{type(err).__name__}: {_first_line(err)}") from None
        if inspect.isgenerator(result):
            return _guarded_lines(result, before)
        return result

    return call


def _guarded_lines(lines: Iterator[Any], before: int) -> Iterator[Any]:
    try:
        yield from lines
    except WRONG_SHAPE as err:
        if SEEN.count == before or isinstance(err, UserError):
            raise
        raise bad_answer(None, f"{type(err).__name__}: {_first_line(err)}") from None
