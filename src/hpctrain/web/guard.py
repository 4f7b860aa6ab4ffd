"""The security rules every request passes (Jupyter server's model), as one ASGI middleware around the pages.

1. The Host header must be a loopback name (localhost, 127.0.0.1, [::1], with any port): a page of another site
   whose name an attacker points at 127.0.0.1 (DNS rebinding) sends its own name and is refused (403).
2. `?token=` with the console's token (printed once at start) is exchanged for a session cookie (HttpOnly,
   SameSite=Strict, the token taken out of the URL by a redirect); any other request without that cookie is
   refused (401), a wrong token too (403).
3. Every request that is not GET or HEAD changes state: it must come from the console's own origin (its Origin
   header, else its Referer, equal to http://HOST) and carry the CSRF token (the form field `csrf` or the header
   X-CSRF-Token), else 403. GET handlers change nothing.
4. Every response carries a Content-Security-Policy that allows scripts, styles, images and connections only from
   the console itself (no inline script, no eval), no framing, and no sniffing of content types.
5. A WebSocket is refused: no page uses one, and one added later must come with rules 1-3.

Secrets are compared in constant time. Nothing here reads a scheduler.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LOOPBACK_HOST = re.compile(r"^(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?$", re.IGNORECASE)
SAFE_METHODS = frozenset({"GET", "HEAD"})
MAX_FORM_BYTES = 64 * 1024
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


@dataclass(frozen=True)
class Secrets:
    """The console's token (in the URL printed once), the session key its cookie holds, and the CSRF token pages
    put in their forms: independent random values, made at start and never written anywhere else."""

    token: str
    session: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def cookie_name(self) -> str:
        """Per console (two consoles on one host do not overwrite each other's cookie); says nothing of the key."""
        return "hpctrain-web-" + hashlib.sha256(self.session.encode()).hexdigest()[:12]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    raw = _header(scope, b"cookie") or ""
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """The ASGI middleware that applies rules 1-4 (module docstring) before `app` sees a request."""

    def __init__(self, app: Callable[..., Awaitable[None]], keys: Secrets) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no page uses one: refused, until one comes with the checks below
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        send = self._with_headers(send)
        host = _header(scope, b"host") or ""
        if not LOOPBACK_HOST.match(host):
            await _refuse(send, 403, "refused: the Host header is not a loopback name (localhost, 127.0.0.1, [::1])")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            await self._log_in(scope, send, query)
            return
        if not _same(_cookie(scope, self.keys.cookie_name), self.keys.session):
            await _refuse(
                send, 401, "not logged in: open the URL with ?token=... that `hpctrain web` printed when it started"
            )
            return
        if scope["method"] not in SAFE_METHODS:
            refusal = _cross_origin(scope, host)
            if refusal is None:
                body, receive = await _read_body(receive)
                if body is None:
                    refusal = "refused: the request body is too large"
                elif not self._csrf_ok(scope, body):
                    refusal = "refused: the request has no valid CSRF token (reload the page and try again)"
            if refusal is not None:
                await _refuse(send, 403, refusal)
                return
        await self.app(scope, receive, send)

    async def _log_in(self, scope: Scope, send: Send, query: dict[str, list[str]]) -> None:
        if not _same(query["token"][0], self.keys.token):
            await _refuse(send, 403, "wrong token: use the URL that `hpctrain web` printed when it started")
            return
        rest = {k: v for k, v in query.items() if k != "token"}
        path = "/" + scope.get("path", "/").lstrip("/")  # `//elsewhere` would send the browser to another host
        location = path + (f"?{urlencode(rest, doseq=True)}" if rest else "")
        cookie = f"{self.keys.cookie_name}={self.keys.session}; Path=/; HttpOnly; SameSite=Strict"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    def _csrf_ok(self, scope: Scope, body: bytes) -> bool:
        given = _header(scope, CSRF_HEADER.encode())
        if given is None and (_header(scope, b"content-type") or "").startswith("application/x-www-form-urlencoded"):
            given = (parse_qs(body.decode("latin-1")).get(CSRF_FIELD) or [None])[0]
        return _same(given, self.keys.csrf)

    @staticmethod
    def _with_headers(send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *HEADERS]
            await send(message)

        return sending


def _cross_origin(scope: Scope, host: str) -> str | None:
    """Why a state-changing request does not come from the console's own page (None: it does)."""
    own = f"http://{host}"
    origin = _header(scope, b"origin")
    if origin is not None:
        return None if origin.lower() == own.lower() else f"refused: a request from another origin ({origin})"
    referer = _header(scope, b"referer")
    if referer is not None and (referer.lower() + "/").startswith(own.lower() + "/"):
        return None
    return "refused: a state-changing request must come from the console's own page (no Origin or Referer)"


async def _read_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body (None past MAX_FORM_BYTES), and a `receive` that gives it again to the app."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_FORM_BYTES:
            return None, receive
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, again


async def _refuse(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
