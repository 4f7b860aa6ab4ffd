"""The official `kubernetes` client, made safe to point at any server the kubeconfig names.

The client as shipped waits forever for a server that accepts and never answers, reads an answer of any size into
memory, and lets urllib3 and ApiException tracebacks reach the user. `load_api_client` returns an ApiClient whose
every request (all of CoreV1Api, CustomObjectsApi, ... share its pool manager):

* has connect and read timeouts, and a deadline for the whole answer (a server that drips a byte every few
  seconds never trips a per-read timeout);
* reads at most `max_response_bytes` of an answer (an endless JSON body);
* turns a connection failure (refused, reset, not HTTP, TLS) into one UserError naming the server and the fix.

`translating(api)` wraps an API object so that an HTTP error the caller does not handle itself becomes one line:
the error raised is both the client's ApiException (so `except ApiException` and `err.status` work as before) and a
UserError (so the CLI prints its message, with the API server's own reason, instead of a traceback).

An answer 429 Too Many Requests (or 503) with a Retry-After is honoured within the request's deadline: the request is
sent again after min(Retry-After, the time left); when the deadline comes first the error says that the server asked
to retry later (urllib3's own retry on it, which slept past the deadline, is turned off).

Limits come from the environment: HPCTRAIN_K8S_TIMEOUT (seconds, default 30; the whole answer gets 4 times that,
a list of many pages (rest.RawApi.pages) 16 times) and HPCTRAIN_K8S_MAX_RESPONSE_MB (default 256).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hpctrain.errors import UserError, redact
from hpctrain.fsutil import format_bytes
from hpctrain.schedulers.kubernetes.api import answers

TIMEOUT_ENV = "HPCTRAIN_K8S_TIMEOUT"
MAX_RESPONSE_ENV = "HPCTRAIN_K8S_MAX_RESPONSE_MB"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_RESPONSE_MB = 256
ANSWER_DEADLINE_FACTOR = 4
LIST_DEADLINE_FACTOR = 4  # a list of many pages gets this many answers' deadlines in all
RETRY_STATUSES = (429, 503)  # answered with a Retry-After: asked to send the request again later
MIN_RETRY_WAIT_S = 1.0  # a Retry-After of 0 (or in the past) still waits this long: no busy loop of requests
CHUNK = 1 << 16
FIX = answers.FIX  # what to check when the API server does not answer as one

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Connect and read timeout of one socket operation."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_MB << 20

    @property
    def deadline_s(self) -> float:
        """For one whole answer, headers and body."""
        return self.timeout_s * ANSWER_DEADLINE_FACTOR

    @property
    def list_deadline_s(self) -> float:
        """For every page of one list together (rest.RawApi.pages)."""
        return self.deadline_s * LIST_DEADLINE_FACTOR

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Limits:
        environ = os.environ if environ is None else environ
        timeout, size = environ.get(TIMEOUT_ENV), environ.get(MAX_RESPONSE_ENV)
        try:
            timeout_s = float(timeout) if timeout else DEFAULT_TIMEOUT_S
            if not 0 < timeout_s <= 3600:
                raise ValueError
        except ValueError:
            raise UserError(f"{TIMEOUT_ENV}={timeout!r} must be a number of seconds above 0 and at most 3600") from None
        if size and (not size.isdigit() or not 0 < int(size) <= 1 << 20):
            raise UserError(f"{MAX_RESPONSE_ENV}={size!r} must be a whole number of megabytes, 1 to 1048576")
        return cls(timeout_s=timeout_s, max_response_bytes=(int(size) if size else DEFAULT_MAX_RESPONSE_MB) << 20)


def load_api_client(context: str | None = None, limits: Limits | None = None) -> Any:
    """An ApiClient from the kubeconfig (its current context, or `context`) or the in-cluster service account.

    Loading runs the kubeconfig's exec credential plugin, if it names one (a program that prints a token), outside
    the bounded requests: it gets the deadline of one answer, and one that never returns ends the command naming
    it (the plugin, a child of this process, is stopped)."""
    from kubernetes import client, config
    import yaml

    limits = limits or Limits.from_environ()

    def load() -> Any:
        if context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return client.ApiClient()
        return config.new_client_from_config(context=context)

    before = _children()

    def hung() -> UserError:
        # The client logs the plugin's end as an error of its own (on the root logger): this line says it instead.
        logging.getLogger().addFilter(lambda record: not record.getMessage().startswith("exec: "))
        for pid in _children() - before:  # the plugin that never returned: started here, by this load
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        plugin = exec_plugin(context)
        named = f"its exec credential plugin ({plugin})" if plugin else "loading it"
        return UserError(
            f"the kubeconfig ({kubeconfig_files()}) did not load within {limits.deadline_s:g} s: {named} "
            f"never returned; run the plugin by hand to see what it waits for (a login?), or allow more "
            f"time: {TIMEOUT_ENV}=SECONDS (loading gets {ANSWER_DEADLINE_FACTOR} times that)"
        )

    try:
        api_client = within(limits.deadline_s, load, hung)
    except IsADirectoryError as err:
        raise UserError(
            f"the kubeconfig {err.filename} is a directory: point KUBECONFIG at the kubeconfig file in it "
            "(e.g. its config)"
        ) from None
    except OSError as err:
        raise UserError(
            f"cannot read the kubeconfig {err.filename or kubeconfig_files()} ({err.strerror or err}): fix "
            "it, or point KUBECONFIG at a working one"
        ) from None
    except config.ConfigException as err:
        raise UserError(
            f"cannot load a kubeconfig ({_one_line(err)}): set KUBECONFIG or ~/.kube/config, or name a --context"
        ) from None
    except yaml.YAMLError as err:
        raise UserError(
            f"the kubeconfig ({kubeconfig_files()}) is not valid YAML ({_one_line(err)[:200]}): fix it, or "
            "point KUBECONFIG at a working one"
        ) from None
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise UserError(
            f"the kubeconfig ({kubeconfig_files()}) is not a valid kubeconfig ({type(err).__name__}: "
            f"{_one_line(err)[:200]}): fix it, or point KUBECONFIG at a working one"
        ) from None
    return harden(api_client, limits)


def _children() -> set[int]:
    """The pids of this process's children, as each of its threads started them (Linux' /proc/self/task/*/children;
    none found where that does not exist)."""
    found: set[int] = set()
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            found.update(int(pid) for pid in listing.read_text().split())
        except (OSError, ValueError):
            continue
    return found


def exec_plugin(context: str | None) -> str | None:
    """The command of the exec credential plugin the kubeconfig's context (or current context) runs, if any; read
    without running it. None when there is none, or the kubeconfig cannot tell."""
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION, KubeConfigMerger

    try:
        merged = KubeConfigMerger(os.environ.get("KUBECONFIG") or KUBE_CONFIG_DEFAULT_LOCATION).config
        name = context or merged.safe_get("current-context")
        ctx = next(c for c in merged["contexts"] if c.safe_get("name") == name)
        user = next(u for u in merged["users"] if u.safe_get("name") == ctx["context"].safe_get("user"))
        command = user["user"]["exec"]["command"]
    except Exception:  # only to name the plugin in an error already on its way
        return None
    return command if isinstance(command, str) else None


def kubeconfig_files(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get("KUBECONFIG") or "~/.kube/config"


def harden(api_client: Any, limits: Limits) -> Any:
    """Route every request of `api_client` through the bounds above (see the module docstring)."""
    rest = api_client.rest_client
    if not isinstance(rest.pool_manager, _BoundedPool):
        rest.pool_manager = _BoundedPool(rest.pool_manager, limits, redact(api_client.configuration.host))
    answers.check_deserializing(api_client, rest.pool_manager.server)
    return api_client


def within(seconds: float, work: Callable[[], T], timed_out: Callable[[], Exception]) -> T:
    """work(), or raise timed_out() after `seconds`. The work runs on a daemon thread: a socket blocked in a read
    cannot be interrupted from here, and the command ends with the error rather than waiting for it."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as err:  # handed to the waiting thread as is
            box["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name="hpctrain-k8s-request", daemon=True).start()
    if not done.wait(seconds):
        raise timed_out()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _BoundedPool:
    """Stands in for the client's urllib3 PoolManager: the same `request`, with timeouts, a deadline, a size cap
    on the answers the client reads whole, and connection errors as UserErrors."""

    def __init__(self, pool: Any, limits: Limits, server: str) -> None:
        self._pool = pool
        self.limits = limits
        self.server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        import time

        import urllib3

        if kwargs.get("timeout") is None:
            # A followed stream (logs -f, watch) waits for new lines as long as the job runs, as kubectl does: only
            # its connection and headers are bounded (the deadline below).
            following = re.search(r"[?&](follow|watch)=true(&|$)", url) is not None
            kwargs["timeout"] = urllib3.Timeout(
                connect=self.limits.timeout_s, read=None if following else self.limits.timeout_s
            )
        kwargs["preload_content"] = False  # read here, bounded, when the client asks for .data
        # urllib3 would sleep a Retry-After out itself, past the deadline: here it is honoured within it (below).
        retries = kwargs.get("retries", getattr(self._pool, "connection_pool_kw", {}).get("retries"))
        if not isinstance(retries, urllib3.Retry):
            retries = urllib3.Retry.from_int(retries if retries is not None else urllib3.Retry.DEFAULT)
        kwargs["retries"] = retries.new(respect_retry_after_header=False)
        deadline = time.monotonic() + self.limits.deadline_s
        while True:
            try:
                response = within(
                    max(0.0, deadline - time.monotonic()),
                    lambda: self._pool.request(method, url, **kwargs),
                    self._no_answer,
                )
            except urllib3.exceptions.HTTPError as err:
                raise self._unreachable(err) from None
            wait = _retry_after(response) if response.status in RETRY_STATUSES else None
            if wait is None:
                return _BoundedResponse(response, self, deadline, (method, url))
            response.close()  # its body unread (it may never end): the request is sent again on a new connection
            if wait > deadline - time.monotonic():
                raise UserError(
                    f"the Kubernetes API server {self.server} asked to retry later ({response.status} "
                    f"{response.reason or 'Too Many Requests'}, Retry-After {wait:g} s), later than the request's "
                    f"deadline of {self.limits.deadline_s:g} s allows: it is overloaded or limits your requests; try "
                    f"again later (or allow more time: {TIMEOUT_ENV}=SECONDS, a request gets "
                    f"{ANSWER_DEADLINE_FACTOR} times that)"
                )
            time.sleep(wait)

    def _no_answer(self) -> UserError:
        return UserError(
            f"the Kubernetes API server {self.server} did not answer within {self.limits.deadline_s:g} s: {FIX} "
            f"(or allow more time: {TIMEOUT_ENV}=SECONDS, per read)"
        )

    def _unreachable(self, err: Exception) -> UserError:
        import urllib3

        reason = getattr(err, "reason", None) or err
        if isinstance(reason, urllib3.exceptions.NewConnectionError):  # a subclass of ConnectTimeoutError, for history
            return UserError(
                f"the Kubernetes API server {self.server} cannot be reached ({_brief_reason(reason)}): {FIX}"
            )
        if isinstance(reason, (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ConnectTimeoutError)):
            return UserError(
                f"the Kubernetes API server {self.server} did not answer within {self.limits.timeout_s:g} s: "
                f"{FIX} (or allow more time: {TIMEOUT_ENV}=SECONDS)"
            )
        elif isinstance(reason, urllib3.exceptions.SSLError):
            what = f"failed the TLS handshake ({_brief_reason(reason)})"
        elif isinstance(reason, urllib3.exceptions.ProtocolError):
            what = f"broke the connection or did not answer in HTTP ({_brief_reason(reason)})"
        else:
            what = f"cannot be reached ({_brief_reason(reason)})"
        return UserError(f"the Kubernetes API server {self.server} {what}: {FIX}")


class _BoundedResponse:
    """A urllib3 response whose `.data` is read within the request's deadline and the size cap; streaming
    (`hpctrain logs`) goes to the response itself."""

    def __init__(self, response: Any, pool: _BoundedPool, deadline: float, asked: tuple[str, str]) -> None:
        self._response = response
        self._pool = pool
        self._deadline = deadline
        self._asked = asked
        self._data: bytes | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)

    @property
    def data(self) -> bytes:
        import time

        if self._data is None:
            left = max(0.0, self._deadline - time.monotonic())
            # On the deadline the reading thread still holds the response (closing it would wait for that read):
            # it is left to end with the command.
            self._data = within(left, self._read, self._pool._no_answer)
            answers.note(self._pool.server, *self._asked, self._response.status, self._response.headers, self._data)
        return self._data

    def _read(self) -> bytes:
        import urllib3

        cap = self._pool.limits.max_response_bytes
        chunks, size = [], 0
        try:
            for chunk in self._response.stream(CHUNK, decode_content=True):
                size += len(chunk)
                if size > cap:
                    raise UserError(
                        f"the Kubernetes API server {self._pool.server} sent an answer larger than {format_bytes(cap)} "
                        f"(the most hpctrain reads): {FIX} (or allow more: {MAX_RESPONSE_ENV}=MEGABYTES)"
                    )
                chunks.append(chunk)
        except urllib3.exceptions.HTTPError as err:
            self._response.close()
            raise self._pool._unreachable(err) from None
        except UserError:
            self._response.close()  # never drain an endless body to reuse the connection
            raise
        self._response.release_conn()
        return b"".join(chunks)


def _retry_after(response: Any) -> float | None:
    """The seconds a 429/503 answer's Retry-After asks to wait (a number, or an HTTP date), at least
    MIN_RETRY_WAIT_S; None without one (or one that is neither): the answer is the error it says."""
    import email.utils
    import math
    import time

    value = (response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    try:
        seconds = float(value) if re.fullmatch(r"[0-9]{1,10}(\.[0-9]{1,6})?", value) else None
        if seconds is None:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(MIN_RETRY_WAIT_S, seconds) if math.isfinite(seconds) else None


def _brief_reason(err: Any) -> str:
    """urllib3's reason without its object addresses: `[Errno 111] Connection refused`."""
    text = _one_line(err)
    text = re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:?\s*", "", text)
    text = text.replace("Failed to establish a new connection: ", "")
    return text[:200]


def _one_line(err: Any) -> str:
    return " ".join(str(err).split())


# ---- HTTP errors ---------------------------------------------------------------------------------------------------


def api_message(err: Any) -> str | None:
    """The API server's own explanation in an error's body (a Status object's `message`), bounded."""
    body = getattr(err, "body", None)
    if not body:
        return None
    try:
        status = json.loads(body)
    except (ValueError, TypeError):
        return None
    message = status.get("message") if isinstance(status, dict) else None
    if not isinstance(message, str) or not message.strip():
        return None
    message = _one_line(message)
    return message if len(message) <= 400 else message[:397] + "..."


def describe_api_error(err: Any, what: str) -> str:
    """One line for an HTTP error of the API server: what failed, its status and reason, and the fix."""
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None) or "error"
    said = api_message(err)
    said = f": {said}" if said else ""
    if status == 401:
        return (
            f"{what}: the API server refused the credentials (401 {reason}{said}); log in again or renew the "
            "kubeconfig's token/certificate"
        )
    if status == 403:
        return (
            f"{what}: forbidden (403 {reason}{said}); ask your cluster admin for the permission, or use another "
            "--namespace"
        )
    if status == 429:
        return (
            f"{what}: the API server asked to retry later (429 {reason}{said}): it is overloaded or limits your "
            "requests; try again later"
        )
    if isinstance(status, int) and status >= 500:
        return f"{what}: the API server failed ({status} {reason}{said}); try again later, or ask the cluster admin"
    return f"{what}: the API server answered {status} {reason}{said}"


@functools.cache
def _error_class() -> type:
    from kubernetes.client.rest import ApiException

    class KubernetesApiError(ApiException, UserError):
        """An ApiException (status, reason, body as the client gives them) that the CLI prints as one line."""

        exit_code = UserError.exit_code

        def __init__(self, original: Any, what: str) -> None:
            ApiException.__init__(self, status=original.status, reason=original.reason)
            self.body, self.headers = original.body, original.headers
            self.line = describe_api_error(original, what)

        def __str__(self) -> str:
            return self.line

    return KubernetesApiError


def translating(api: Any) -> Any:
    """`api` (CoreV1Api, CustomObjectsApi, ...) whose calls raise KubernetesApiError for HTTP errors."""
    return _Translating(api)


class _Translating:
    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._api, name)
        if not callable(attr) or name.startswith(("_", "connect_")):
            return (
                attr  # connect_* (exec, attach, port-forward) go through kubernetes.stream, whose callers judge errors
            )
        from kubernetes.client.rest import ApiException

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except ApiException as err:
                if isinstance(err, UserError):
                    raise
                raise _error_class()(err, _call_words(name, args)) from None

        call.__self__ = self._api  # kubernetes.stream.stream() finds the client there
        call.__name__ = name
        return call


def _call_words(name: str, args: tuple[Any, ...]) -> str:
    """`list_namespaced_pod` -> "list namespaced pod"."""
    return name.replace("_with_http_info", "").replace("_", " ")


# ---- lists, a page at a time (rest.RawApi.list) -------------------------------------------------------------------

PAGE_SIZE = 500  # objects per list request, as kubectl's --chunk-size
