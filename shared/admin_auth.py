"""The admin API's bearer token and bind rules, shared by the controller (which checks) and the
`dynsched` CLI (which sends).

Where it sits: the controller's `__main__` refuses to bind a non-loopback address without a token
(`check_bind`) and its admin app requires the token (services/controller/admin_guard.py); the CLI
reads the same environment (`load_admin_token`) and sends `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from pathlib import Path

TOKEN_ENV = "DYNSCHED_ADMIN_TOKEN"
"""The admin token itself."""
TOKEN_FILE_ENV = "DYNSCHED_ADMIN_TOKEN_FILE"
"""A file holding the admin token (a compose/k8s secret); read when TOKEN_ENV is not set."""
ADMIN_BACKLOG = 2048
"""Connections the admin socket queues before the server accepts them (uvicorn's default backlog)."""
MAX_BODY_BYTES = 64 * 1024
"""Largest request body the admin API reads; bigger ones get 413 before they are buffered."""


def load_admin_token(environ: Mapping[str, str] | None = None) -> str:
    """The configured token ('' when none); ValueError (one line) for an unreadable or empty file."""
    env = os.environ if environ is None else environ
    if token := env.get(TOKEN_ENV, "").strip():
        return token
    path = env.get(TOKEN_FILE_ENV, "").strip()
    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{TOKEN_FILE_ENV}={path}: cannot read the admin token ({exc.strerror})") from exc
    if not token:
        raise ValueError(f"{TOKEN_FILE_ENV}={path}: the file is empty")
    return token


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and 'localhost' are loopback; anything else (0.0.0.0 included) is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_admin_socket(host: str, port: int) -> socket.socket:
    """The admin API's listening socket, bound as the controller binds it (SO_REUSEADDR: a restart reuses a
    fixed port at once); OSError when another process holds the port. The CLI binds one the same way
    before a run starts, to say so in one line. It listens at once: the controller publishes its address
    before the server starts accepting, and a client that reads the address in between (the CLI, a
    browser) must wait in the backlog, not be refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(ADMIN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def check_bind(host: str, token: str) -> None:
    """ValueError (one line) when the admin API would listen beyond this machine without a token."""
    if not is_loopback(host) and not token:
        raise ValueError(f"run.admin_host={host} is not a loopback address: set {TOKEN_ENV} or "
                         f"{TOKEN_FILE_ENV} (every endpoint then requires it), or bind 127.0.0.1")
