"""What every service's `main` shares: arguments, logging, signals, the bus, supervised loops.

Where it sits: `services/<name>/__main__.py` calls `service_args` and
`run_until_stopped`; each service runs its loops with `supervise`. Nothing here
knows about any particular service.

Supervision: a service's loops run as one task group. When one loop fails, the
others are cancelled and the failure ends the process with a non-zero status, so
its restart policy (compose's `restart:`, the launcher) starts a fresh one. A
process never lingers half-alive: once a loop has failed, a watchdog ends the
process (status 1) if shutdown has not finished within EXIT_GRACE_S (a loop that
will not cancel, a thread stuck in a call).

A loop that is stuck without failing (a blocking call on the event loop, tasks deadlocked, a wait
that never beats) ends the process too: a watchdog thread exits it (status 1) once a loop has not
beaten for `run.stuck_loop_exit_s`, the budget after which the launcher would kill it as hung. So
compose's `restart:` restarts it as after a crash (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from shared.bus import Bus
from shared.config import Config, RunConfig, load_config
from shared.liveness import LIVENESS, beat, current_loop, stale_loops
from shared.names import Names
from shared.redis_client import PROCESS_STOP
from shared.streams import connect

log = logging.getLogger(__name__)
T = TypeVar("T")
EXIT_GRACE_S = 10.0
"""After a loop failed, the process exits (status 1) within this long even if shutdown hangs."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago ("" = every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def sleep_unless(event: asyncio.Event, timeout_s: float) -> bool:
    """Sleep up to `timeout_s`, returning early (True) when `event` is set.

    Uses `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` can swallow a
    cancellation that races with completion, leaving a cancelled service running."""
    beat()
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    finally:
        beat()
    return True


THREAD_BEAT_S = 1.0
"""While a loop waits on a worker thread (`in_thread`), it beats this often."""


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """`asyncio.to_thread(fn, *args)`, beating the calling loop while the thread runs.

    A loop waiting on a thread is working, not hung: a training step, a checkpoint or a weight push
    can take minutes on a large model, longer than `run.loop_stale_s`, and a loop that did not beat
    meanwhile would be reported stale (and killed by the launcher as hung). The event loop itself stays
    free, so what this vouches for is that the process still serves its loops; a thread stuck for good
    in a C call looks like a long step (what a health check cannot tell apart)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=THREAD_BEAT_S)
            beat()
            if done:
                return task.result()
    finally:
        task.cancel()  # when the caller was cancelled: the thread runs on, nobody waits for it


class _ExitWatchdog:
    """Armed by the first failed loop of a service process (`run_until_stopped` enables it; in a
    test's event loop it stays off): ends the process with status 1 after EXIT_GRACE_S."""

    def __init__(self) -> None:
        self.enabled = False
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self.enabled and self._timer is None:
            self._timer = threading.Timer(EXIT_GRACE_S, self._exit)
            self._timer.daemon = True
            self._timer.start()

    @staticmethod
    def _exit() -> None:
        print(f"shutdown still running {EXIT_GRACE_S:.0f}s after a loop failed: exiting with status 1",
              file=sys.stderr, flush=True)
        os._exit(1)


_WATCHDOG = _ExitWatchdog()
STUCK_POLL_S = 1.0
"""The stuck-loop watchdog reads the loops' ages this often."""
PAUSED_AFTER_S = 2.0
"""A watchdog poll this much later than due means the whole process was not running (SIGSTOP, docker
pause, a suspended host): every loop then gets its budget afresh, counted from the resume."""
LOG_TIMEOUT_S = 1.0
"""The stuck-loop watchdog exits this long after it started logging why, even if the log blocks (a
stuck loop may hold the log's lock, or be stuck writing to a full pipe)."""


class _StuckLoopWatchdog:
    """A thread, not a task (a stuck event loop cannot run one), started by `run_until_stopped`: ends the
    process with status 1 once one of its loops has not beaten for `budget_s` while the process ran.

    It judges only from the moment the service's body starts its loops (its `supervise`), counting
    every loop's budget from then: a start-up that blocks the event loop (a vLLM engine loading for
    minutes) is not judged. Waits on a stream read, a peer's ack or a worker thread beat
    (shared.liveness), so a loop that waits is never taken for a stuck one. Time the process did not
    run at all is not counted (a stopped process cannot act; the launcher handles that case)."""

    def __init__(self) -> None:
        self.loops_started = threading.Event()

    def start(self, service: str, budget_s: float) -> None:
        """Watch the running event loop (call from it)."""
        args = (service, budget_s, asyncio.get_running_loop(), threading.get_ident())
        threading.Thread(target=self._watch, args=args, name="stuck-loop-watchdog", daemon=True).start()

    def _watch(self, service: str, budget_s: float, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        self.loops_started.wait()
        judged_since = last_poll = time.monotonic()
        while True:
            time.sleep(STUCK_POLL_S)
            now = time.monotonic()
            if now - last_poll > STUCK_POLL_S + PAUSED_AFTER_S:
                judged_since = now
            last_poll = now
            if now - judged_since <= budget_s:
                continue
            ages = LIVENESS.ages()
            stuck = sorted(stale_loops(ages, budget_s), key=ages.__getitem__, reverse=True)
            if stuck:
                loops = ", ".join(f"{name} {ages[name]:.1f}s" for name in stuck)
                _exit_stuck(f"service {service} is stuck: no progress in {loops} (more than "
                            f"run.loop_stale_s + run.hung_grace_s = {budget_s:g}s); "
                            f"{_event_loop_at(loop, thread_id)}")


def _event_loop_at(loop: asyncio.AbstractEventLoop, thread_id: int) -> str:
    """Where the event loop is: when a blocking call holds it, the task running now is the culprit."""
    task = asyncio.current_task(loop)
    frame = sys._current_frames().get(thread_id)
    if task is None or frame is None:
        return "the event loop runs no task (a loop waits for what never comes, without a beat)"
    code = frame.f_code
    return (f"the event loop runs task {task.get_name()} at {code.co_filename}:{frame.f_lineno} "
            f"({code.co_name})")


def _exit_stuck(line: str) -> None:
    writer = threading.Thread(target=log.critical, args=(f"{line}; exiting with status 1 so that it is "
                                                         "restarted",), daemon=True)
    writer.start()
    writer.join(LOG_TIMEOUT_S)
    os._exit(1)


_STUCK = _StuckLoopWatchdog()
_LOGGED = "_dynsched_loop_failure_logged"
"""Marks an exception its loop has logged, so the loops it passes through on its way out do not."""


async def supervise(loops: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run `loops` (name -> coroutine) as one task group until all return. The first to raise
    cancels the others and its exception is raised here (the group's, if several failed), so the
    process exits non-zero. Each loop is named for liveness (shared.liveness); the caller's own
    loop, if any, is represented by these while they run."""
    outer = current_loop()
    if outer is not None:  # a service's body starting its loops: its start-up is over
        _STUCK.loops_started.set()
        LIVENESS.leave(outer)
    try:
        async with asyncio.TaskGroup() as group:
            for name, loop in loops.items():
                group.create_task(_run_loop(name, loop), name=name)
    except BaseExceptionGroup as failed:
        if len(failed.exceptions) == 1:
            raise failed.exceptions[0] from None
        raise
    finally:
        if outer is not None:
            LIVENESS.enter(outer)


async def _run_loop(name: str, loop: Coroutine[Any, Any, None]) -> None:
    LIVENESS.enter(name)
    try:
        await loop
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        if not getattr(exc, _LOGGED, False):  # an outer loop re-raising an inner one's failure
            log.exception("loop %s failed: stopping the process (exit status 1)", name)
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, _LOGGED, True)
        _WATCHDOG.arm()
        raise
    finally:
        LIVENESS.leave(name)


def service_args(description: str, argv: list[str] | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--redis-url", required=True, help="e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--log-level", default="INFO")
    if extra:
        extra(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args


def load(args: argparse.Namespace) -> tuple[Config, Names]:
    config = load_config(args.config)
    return config, Names(config.run.namespace)


def run_until_stopped(body: Callable[[Bus, asyncio.Event], Coroutine[Any, Any, None]], *, redis_url: str,
                      names: Names, service: str, run: RunConfig) -> None:
    """Run `body(bus, stop)` as the loop `service`, next to the loop publishing this process's
    health (shared.health); SIGTERM/SIGINT set `stop` and stop `PROCESS_STOP` (Redis calls from then on
    retry an unreachable Redis for STOP_RETRY_WINDOW_S only). A failed loop exits the process with
    status 1 (promptly: see `supervise`), and so does a loop stuck for `run.stuck_loop_exit_s`
    once the body's loops run (`_StuckLoopWatchdog`); the Redis client is closed in `finally`. Redis calls
    retry for `run.redis_retry_window_s`; readers trim by `run.stream_retention_s`; the streams no
    group reads are capped at `run.event_stream_maxlen`."""
    from shared.health import publish_health  # health imports this module

    async def main() -> None:
        _STUCK.start(service, run.stuck_loop_exit_s)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        def stop_process() -> None:
            stop.set()
            PROCESS_STOP.stop()  # the last writes of a stop retry an unreachable Redis for seconds only

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_process)
        redis = connect(redis_url, retry_window_s=run.redis_retry_window_s)
        bus = Bus(redis, names, retention_s=run.stream_retention_s, dead_letter_maxlen=run.dead_letter_maxlen,
                  event_maxlen=run.event_stream_maxlen)
        body_done = asyncio.Event()

        async def run_body() -> None:
            try:
                await body(bus, stop)
            finally:
                body_done.set()  # the process ends with its body, health loop included

        try:
            await supervise({service: run_body(),
                             f"{service}.health": publish_health(bus, service, body_done)})
        finally:
            await redis.aclose()

    _WATCHDOG.enabled = True
    try:
        asyncio.run(main())
    except Exception:  # logged by the loop that failed
        sys.exit(1)
