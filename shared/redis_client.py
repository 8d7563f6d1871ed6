"""Redis clients for the services: timeouts, retries and pool sizing in one place.

Where it sits: every service gets its asyncio client from `connect`; the
stream consumers of `shared.streams` read on a `dedicated_client` of their
own; the launcher's synchronous client comes from `connect_sync`. Blocking
reads must end well before a reply would time out, hence the assertion
between BLOCK_MS and SOCKET_TIMEOUT_S.

A Redis outage (a crash and restart, a network cut) is survived for a bounded
window: every call retries connection errors and timeouts with backoff until
Redis has been unreachable for `retry_window_s` (config `run.redis_retry_window_s`),
then raises. Once the process is stopping (its SIGTERM or SIGINT came: `PROCESS_STOP`), a call
retries for at most STOP_RETRY_WINDOW_S more: a stopped service whose Redis is gone (an orphan whose
launcher and Redis died together has no one to SIGKILL it) exits in seconds, not after the whole
window spent on its last writes. The window is measured from a call's first failure; the retries
redis-py nests inside one call (connect, health check, command) share it
instead of multiplying it. A caller waiting for a free connection of the pool
waits as long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import AbstractRetry
from redis.retry import Retry as SyncRetry

from shared.liveness import beat
from shared.names import REDIS_RETRY_WINDOW_S as RETRY_WINDOW_S

log = logging.getLogger(__name__)
T = TypeVar("T")
E = TypeVar("E", bound=Exception)

SOCKET_TIMEOUT_S = 10.0  # any single reply slower than this is an error
BLOCK_MS = 2_000  # default XREADGROUP BLOCK: returns long before the socket would time out
assert BLOCK_MS < SOCKET_TIMEOUT_S * 1000 / 2, "BLOCK_MS must stay well below the socket timeout"
HEALTH_CHECK_INTERVAL_S = 30  # connections idle longer than this are PINGed before use
MAX_CONNECTIONS = 32  # per client; callers beyond it wait for a free connection
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0
STOP_RETRY_WINDOW_S = 3.0
"""How long a call still retries an unreachable Redis once its process is stopping (`StopClock`)."""


RETRIED_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
"""What a call retries (both clients)."""
SYNC_RETRIED_ERRORS = (*RETRIED_ERRORS, OSError)
"""The synchronous client's also: a bare socket error (socket.timeout too), as redis-py's own sync Retry."""


class StopClock:
    """When this process began to stop (`since_s`, None while it runs), and what that leaves of a call's
    retry window."""

    def __init__(self) -> None:
        self.since_s: float | None = None

    def stop(self) -> None:
        """The process is stopping: from now on calls give up on an unreachable Redis sooner."""
        if self.since_s is None:
            self.since_s = time.monotonic()

    def deadline_s(self, first_failure_s: float, window_s: float) -> float:
        """When a call that first failed at `first_failure_s` gives up: at the end of its window, or
        STOP_RETRY_WINDOW_S after its first failure or the stop, whichever came later, if that is sooner."""
        deadline_s = first_failure_s + window_s
        if self.since_s is not None:
            deadline_s = min(deadline_s, max(first_failure_s, self.since_s) + STOP_RETRY_WINDOW_S)
        return deadline_s


PROCESS_STOP = StopClock()
"""This process's stop (`shared.runtime.run_until_stopped` stops it at SIGTERM/SIGINT), read by every call."""


class RetryWindow:
    """The retry policy of both clients, in one place: which errors retry (`errors`), the backoff
    between tries, and the window: a call gives up once Redis has been failing for `window_s` since
    its first failure, or sooner once `stop` (the process's StopClock) has stopped. redis-py nests
    retries (a command's retry around a connect's retry around a health check); only the outermost
    call starts and ends the clock, so the nested ones share its window. `on_failure` runs at each
    failed try. One per connection: see `copy`."""

    def __init__(self, window_s: float, errors: tuple[type[Exception], ...] = RETRIED_ERRORS,
                 on_failure: Callable[[], None] | None = None, stop: StopClock = PROCESS_STOP) -> None:
        if window_s < 0:
            raise ValueError(f"retry window must be >= 0 s, got {window_s}")
        self.window_s = window_s
        self.errors = errors
        self.on_failure = on_failure
        self.stop = stop
        self.backoff = ExponentialWithJitterBackoff(base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S)
        self.since_s: float | None = None
        self.depth = 0

    def copy(self) -> RetryWindow:
        """The same policy with an outage clock of its own (the `on_failure` hook and the stop are shared)."""
        return RetryWindow(self.window_s, self.errors, self.on_failure, self.stop)

    @contextmanager
    def call(self) -> Iterator[None]:
        """One call's tries: the outermost one's end resets the clock."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.since_s = None

    def succeeded(self, result: T) -> T:
        if self.since_s is not None and self.depth == 1:
            log.warning("Redis reachable again after %.1fs", time.monotonic() - self.since_s)
        return result

    def wait_s(self, error: Exception, failures: int) -> float | None:
        """After a call's `failures`-th failed try: seconds to wait before the next one, None to give up."""
        if self.on_failure is not None:
            self.on_failure()
        now_s = time.monotonic()
        if self.since_s is None:
            self.since_s = now_s
            log.warning("Redis call failed (%r); retrying for up to %.0fs", error, self.window_s)
        left_s = self.stop.deadline_s(self.since_s, self.window_s) - now_s
        return min(left_s, self.backoff.compute(failures)) if left_s > 0 else None


class _Windowed(AbstractRetry[E]):
    """What both retries below share: a RetryWindow, and a copy with a clock of its own per
    connection (redis-py deep-copies the retry into each)."""

    def __init__(self, window: RetryWindow) -> None:
        super().__init__(window.backoff, -1, window.errors)  # type: ignore[arg-type]  # the Retry after us
        self.window = window

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        copy = type(self)(self.window.copy())
        copy.update_supported_errors(self._supported_errors)  # what redis-py added (retry_on_error)
        return copy


class WindowRetry(_Windowed[RedisError], Retry):
    """redis-py's asyncio Retry bounded by a RetryWindow instead of a count."""

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
                              is_retryable: Callable[[Exception], bool] | None = None,
                              with_failure_count: bool = False) -> T:
        failures = 0
        with self.window.call():
            while True:
                try:
                    return self.window.succeeded(await do())
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    await (fail(error, failures) if with_failure_count else fail(error))
                    if (wait_s := self.window.wait_s(error, failures)) is None:
                        raise
                    beat()  # waiting for Redis within the window is a wait that ends, not a stuck loop
                    await asyncio.sleep(wait_s)


class SyncWindowRetry(_Windowed[Exception], SyncRetry):
    """WindowRetry for the launcher's synchronous client: the same loop but for `await`."""

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        failures = 0
        with self.window.call():
            while True:
                try:
                    return self.window.succeeded(do())
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    fail(error, failures) if with_failure_count else fail(error)
                    if (wait_s := self.window.wait_s(error, failures)) is None:
                        raise
                    time.sleep(wait_s)


def connect(url: str, *, socket_timeout_s: float = SOCKET_TIMEOUT_S,
            health_check_interval_s: int = HEALTH_CHECK_INTERVAL_S, retry_window_s: float = RETRY_WINDOW_S,
            client_name: str | None = None) -> aredis.Redis:
    """An asyncio bytes client retrying connection errors with backoff for `retry_window_s`; its pool
    waits when every connection is busy (redis-py's default pool raises). ``aclose()`` it."""
    if socket_timeout_s * 1000 <= 2 * BLOCK_MS:
        raise ValueError(f"socket_timeout_s={socket_timeout_s} must exceed twice BLOCK_MS={BLOCK_MS} ms")
    pool = aredis.BlockingConnectionPool.from_url(  # in an outage every connection may be busy retrying
        url, max_connections=MAX_CONNECTIONS, timeout=max(socket_timeout_s, retry_window_s),
        socket_timeout=socket_timeout_s, socket_connect_timeout=min(socket_timeout_s, 5.0),
        health_check_interval=health_check_interval_s, client_name=client_name,
        retry=WindowRetry(RetryWindow(retry_window_s)), retry_on_error=list(RETRIED_ERRORS))
    return aredis.Redis(connection_pool=pool)


def connect_sync(url: str, *, socket_timeout_s: float = SOCKET_TIMEOUT_S,
                 retry_window_s: float = RETRY_WINDOW_S,
                 on_failure: Callable[[], None] | None = None) -> redis.Redis:
    """A synchronous client (the launcher's) with the same bounded retry window; `on_failure` is
    called at each failed try (the launcher restarts its own Redis there)."""
    window = RetryWindow(retry_window_s, SYNC_RETRIED_ERRORS, on_failure)
    return redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                socket_connect_timeout=min(socket_timeout_s, 5.0),
                                retry=SyncWindowRetry(window), retry_on_error=list(RETRIED_ERRORS))


def retry_window_s(r: aredis.Redis) -> float:
    """The retry window of a client made by `connect` (RETRY_WINDOW_S for any other client)."""
    retry = r.connection_pool.connection_kwargs.get("retry")
    return retry.window.window_s if isinstance(retry, WindowRetry) else RETRY_WINDOW_S


def dedicated_client(r: aredis.Redis) -> aredis.Redis:
    """A one-connection client like ``r`` without command retries: a retried
    XREADGROUP would hide a lost reply; the consumer retries and replays instead."""
    pool = r.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.pop("retry_on_error", None)
    new_pool = aredis.ConnectionPool(connection_class=pool.connection_class, max_connections=1, **kwargs)
    return aredis.Redis(connection_pool=new_pool)


def as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
