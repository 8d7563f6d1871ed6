"""What stands in front of the admin API: the bearer token and the body cap.

Where it sits: wrapped around the FastAPI app by `admin.build_app`, so it runs before any handler
and before FastAPI reads a body. The rules, in order:

1. The probes (/healthz, /readyz) and the dashboard's static page are public: they carry no run
   data (the page's own requests carry the token).
2. A mutating request (anything but GET/HEAD/OPTIONS), and every request when the API is bound
   to a non-loopback address, needs `Authorization: Bearer <token>`: 401 without it or with a
   wrong one, 403 when no token is configured (a loopback API without a token is read-only).
3. A body larger than MAX_BODY_BYTES gets 413, judged by Content-Length when there is one and
   while reading otherwise, so at most MAX_BODY_BYTES + one chunk is ever buffered.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.admin_auth import MAX_BODY_BYTES, TOKEN_ENV, TOKEN_FILE_ENV

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/dashboard"})
PUBLIC_PREFIXES = ("/dashboard/",)
"""The dashboard's static files (dashboard.py serves only its own static folder there)."""
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class AdminGuard:
    """ASGI middleware enforcing the token and the body cap (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, token: str, loopback: bool,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if refusal := self._refuse(scope):
            await _reply(send, *refusal)
            return
        body = await self._read_body(scope, receive)
        if body is None:
            await _reply(send, 413, f"request body larger than {self.max_body_bytes} bytes")
            return
        await self.app(scope, _replay(body, receive), send)

    def _refuse(self, scope: Scope) -> tuple[int, str, dict[str, str]] | None:
        path, method = scope["path"], scope["method"]
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return None
        if method in READ_METHODS and self.loopback:
            return None
        if not self.token:
            return 403, (f"no admin token is configured: set {TOKEN_ENV} or {TOKEN_FILE_ENV} for the "
                         "controller (and the client) to use this endpoint"), {}
        given = _header(scope, b"authorization")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(),
                                                                 self.token.encode()):
            return 401, "missing or wrong admin token (Authorization: Bearer <token>)", {
                "www-authenticate": "Bearer"}
        return None

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None once it is past the cap (by Content-Length or as it streams)."""
        declared = _header(scope, b"content-length")
        if declared and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # disconnected: the app sees an empty body and no client
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then the original (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    payload: Any = json.dumps({"detail": detail}).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
