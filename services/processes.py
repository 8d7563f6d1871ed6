"""The launcher's child processes: which services a run starts, how one is started and stopped.

Where it sits: `services/launcher.py` (the `Job`) uses these to run one process per service and per
rollout replica; tests start single services with `start_service`. No service imports this.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shared.config import Config
from shared.names import worker_process_name

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 30
PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends a process when the thread that started it exits."""
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
"""What `dynsched run` stops on (services/cli.py raises KeyboardInterrupt for each)."""


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """One child process: `python -m <module> --config FILE --redis-url URL <extra_args>`."""

    name: str
    module: str
    extra_args: tuple[str, ...] = ()
    health_name: str = ""
    """The service name its health key is published under (`Names.health`); '' = `name`."""


def service_specs(config: Config) -> list[ServiceSpec]:
    """Every service of a run, in start order (controller first, trainer last), one worker per replica."""
    replicas = [ServiceSpec(name=f"rollout_worker-{replica_id}", module="services.rollout_worker",
                            extra_args=("--replica-id", replica_id),
                            health_name=worker_process_name([replica_id]))
                for replica_id in (*config.standalone_ids, *config.hybrid_ids)]
    return [ServiceSpec(name="controller", module="services.controller"),
            ServiceSpec(name="loadbalancer", module="services.loadbalancer"), *replicas,
            ServiceSpec(name="rollouter", module="services.rollouter"),
            ServiceSpec(name="trainer", module="services.trainer")]


def stop_with_launcher() -> Callable[[], None] | None:
    """A `preexec_fn` that makes Linux SIGTERM the child when the launcher dies, however it dies (a
    SIGKILL, a closed terminal's SIGHUP): without it the services, in their own sessions, and the embedded
    redis-server ran on for ever as orphans, holding the admin port. None (no such guard) off Linux. The
    launcher starts children from its main thread only (the signal follows the starting thread)."""
    if not sys.platform.startswith("linux"):
        return None
    launcher_pid = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != launcher_pid:  # the launcher died before the guard was set
            os._exit(0)

    return set_death_signal


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold the stop signals until the block ends, then raise the first that came: the launcher starts and
    records each child inside it (from its main thread, where Python runs signal handlers). Raised inside
    `Popen` after the fork, the interrupt left a started child no stop knew of, which outlived the
    launcher while it retried the stopped Redis (seen once in CI: a trainer). A child does not inherit
    the handlers (exec resets them). Off the main thread no handler runs there, and nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


def start_service(spec: ServiceSpec, *, config_path: Path, redis_url: str,
                  log_path: Path) -> subprocess.Popen[bytes]:
    """Start one child in its own session (so the launcher, not the terminal, decides the stop order)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", spec.module, "--config", str(config_path), "--redis-url", redis_url,
           *spec.extra_args]
    with log_path.open("ab") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT,
                                start_new_session=True, preexec_fn=stop_with_launcher())


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (it leads one: `start_new_session`), the child itself if still
    running and whatever it left: a rollout worker that exits without stopping its engine (a crash, the
    stuck-loop exit) leaves vLLM's EngineCore process running, holding its memory (on a GPU host, the
    memory its restart needs)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_services(procs: dict[str, subprocess.Popen[bytes]], *,
                  timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int]:
    """SIGTERM every child (last started first), SIGKILL what is left after `timeout_s`; the exit codes."""
    for proc in reversed(procs.values()):
        if proc.poll() is None:
            proc.terminate()
    deadline_s = time.monotonic() + timeout_s
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", name, timeout_s)
            proc.kill()
            proc.wait()
        kill_group(proc)  # what an exited child left
    return {name: int(proc.returncode) for name, proc in procs.items()}


def log_tail(path: Path, num_lines: int = LOG_TAIL_LINES) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-num_lines:])
