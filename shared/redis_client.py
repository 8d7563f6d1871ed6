"""Redis clients for the services: timeouts, retries and pool sizing in one place.

Where it sits: every service gets its asyncio client from `connect`; the
stream consumers of `shared.streams` read on a `dedicated_client` of their
own; the launcher's synchronous client comes from `connect_sync`. Blocking
reads must end well before a reply would time out, hence the assertion
between BLOCK_MS and SOCKET_TIMEOUT_S.

A Redis outage (a crash and restart, a network cut) is survived for a bounded
window: every call retries connection errors and timeouts with backoff until
Redis has been unreachable for `retry_window_s` (config `run.redis_retry_window_s`),
then raises. The window is measured from a call's first failure; the retries
redis-py nests inside one call (connect, health check, command) share it
instead of multiplying it. A caller waiting for a free connection of the pool
waits as long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from shared.names import REDIS_RETRY_WINDOW_S as RETRY_WINDOW_S

log = logging.getLogger(__name__)
T = TypeVar("T")

SOCKET_TIMEOUT_S = 10.0  # any single reply slower than this is an error
BLOCK_MS = 2_000  # default XREADGROUP BLOCK: returns long before the socket would time out
assert BLOCK_MS < SOCKET_TIMEOUT_S * 1000 / 2, "BLOCK_MS must stay well below the socket timeout"
HEALTH_CHECK_INTERVAL_S = 30  # connections idle longer than this are PINGed before use
MAX_CONNECTIONS = 32  # per client; callers beyond it wait for a free connection
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0


class _Outage:
    """The retry clock of one connection: since when its outermost call has been failing. redis-py
    nests retries (a command's retry around a connect's retry around a health check); only the
    outermost call starts and ends the clock, so the nested ones share its window."""

    def __init__(self, window_s: float) -> None:
        if window_s < 0:
            raise ValueError(f"retry window must be >= 0 s, got {window_s}")
        self.window_s = window_s
        self.since_s: float | None = None
        self.depth = 0

    def enter(self) -> None:
        self.depth += 1

    def exit(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.since_s = None

    def failed(self, error: Exception) -> float:
        """Seconds left to retry (<= 0: give up)."""
        now_s = time.monotonic()
        if self.since_s is None:
            self.since_s = now_s
            log.warning("Redis call failed (%r); retrying for up to %.0fs", error, self.window_s)
        return self.since_s + self.window_s - now_s

    def succeeded(self) -> None:
        if self.since_s is not None and self.depth == 1:
            log.warning("Redis reachable again after %.1fs", time.monotonic() - self.since_s)


class WindowRetry(Retry):
    """redis-py's asyncio Retry bounded by time instead of a count (see the module docstring)."""

    def __init__(self, window_s: float) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S), -1,
                         (RedisConnectionError, RedisTimeoutError))
        self.outage = _Outage(window_s)

    def __deepcopy__(self, memo: dict[int, Any]) -> WindowRetry:
        """redis-py copies the policy into each connection: same window, an outage clock of its own."""
        copy = WindowRetry(self.outage.window_s)
        copy.update_supported_errors(self._supported_errors)
        return copy

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
                              is_retryable: Callable[[Exception], bool] | None = None,
                              with_failure_count: bool = False) -> T:
        self.outage.enter()
        try:
            failures = 0
            while True:
                try:
                    result = await do()
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    await (fail(error, failures) if with_failure_count else fail(error))
                    left_s = self.outage.failed(error)
                    if left_s <= 0:
                        raise
                    await asyncio.sleep(min(left_s, self._backoff.compute(failures)))
                else:
                    self.outage.succeeded()
                    return result
        finally:
            self.outage.exit()


class SyncWindowRetry(SyncRetry):
    """The same policy for the launcher's synchronous client."""

    def __init__(self, window_s: float, on_failure: Callable[[], None] | None = None) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S), -1,
                         (RedisConnectionError, RedisTimeoutError, OSError))
        self.outage = _Outage(window_s)
        self.on_failure = on_failure

    def __deepcopy__(self, memo: dict[int, Any]) -> SyncWindowRetry:
        """As WindowRetry's; the `on_failure` hook is shared, not copied."""
        copy = SyncWindowRetry(self.outage.window_s, self.on_failure)
        copy.update_supported_errors(self._supported_errors)
        return copy

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        self.outage.enter()
        try:
            failures = 0
            while True:
                try:
                    result = do()
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    fail(error, failures) if with_failure_count else fail(error)
                    if self.on_failure is not None:
                        self.on_failure()
                    left_s = self.outage.failed(error)
                    if left_s <= 0:
                        raise
                    time.sleep(min(left_s, self._backoff.compute(failures)))
                else:
                    self.outage.succeeded()
                    return result
        finally:
            self.outage.exit()


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
        retry=WindowRetry(retry_window_s), retry_on_error=[RedisConnectionError, RedisTimeoutError])
    return aredis.Redis(connection_pool=pool)


def connect_sync(url: str, *, socket_timeout_s: float = SOCKET_TIMEOUT_S,
                 retry_window_s: float = RETRY_WINDOW_S,
                 on_failure: Callable[[], None] | None = None) -> redis.Redis:
    """A synchronous client (the launcher's) with the same bounded retry window; `on_failure` is
    called at each failed try (the launcher restarts its own Redis there)."""
    return redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                socket_connect_timeout=min(socket_timeout_s, 5.0),
                                retry=SyncWindowRetry(retry_window_s, on_failure),
                                retry_on_error=[RedisConnectionError, RedisTimeoutError])


def retry_window_s(r: aredis.Redis) -> float:
    """The retry window of a client made by `connect` (RETRY_WINDOW_S for any other client)."""
    retry = r.connection_pool.connection_kwargs.get("retry")
    return retry.outage.window_s if isinstance(retry, WindowRetry) else RETRY_WINDOW_S


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
