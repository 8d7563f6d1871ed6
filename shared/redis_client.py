"""Redis clients for the services: timeouts, retries and pool sizing in one place.

Where it sits: every service gets its asyncio client from `connect`; the
stream consumers of `shared.streams` read on a `dedicated_client` of their
own. Blocking reads must end well before a reply would time out, hence the
assertion between BLOCK_MS and SOCKET_TIMEOUT_S.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

SOCKET_TIMEOUT_S = 10.0  # any single reply slower than this is an error
BLOCK_MS = 2_000  # default XREADGROUP BLOCK: returns long before the socket would time out
assert BLOCK_MS < SOCKET_TIMEOUT_S * 1000 / 2, "BLOCK_MS must stay well below the socket timeout"
HEALTH_CHECK_INTERVAL_S = 30  # connections idle longer than this are PINGed before use
MAX_CONNECTIONS = 32  # per client; callers beyond it wait for a free connection


def connect(url: str, *, socket_timeout_s: float = SOCKET_TIMEOUT_S,
            health_check_interval_s: int = HEALTH_CHECK_INTERVAL_S,
            client_name: str | None = None) -> aredis.Redis:
    """An asyncio bytes client retrying connection errors with backoff; its pool waits when every
    connection is busy (redis-py's default pool raises). ``aclose()`` it."""
    if socket_timeout_s * 1000 <= 2 * BLOCK_MS:
        raise ValueError(f"socket_timeout_s={socket_timeout_s} must exceed twice BLOCK_MS={BLOCK_MS} ms")
    pool = aredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=socket_timeout_s,
        socket_timeout=socket_timeout_s, socket_connect_timeout=min(socket_timeout_s, 5.0),
        health_check_interval=health_check_interval_s, client_name=client_name,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError])
    return aredis.Redis(connection_pool=pool)


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
