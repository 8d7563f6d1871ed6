"""A worker's heartbeat while its engines start, so a worker that dies during start-up is seen
gone within one heartbeat TTL (seconds), not after a long start-up lease.

Where it sits: `python -m services.rollout_worker` starts it before building the engines and
stops it once they are up; `RolloutWorker.run` then keeps the same key alive with the same
incarnation. It is a thread with its own synchronous Redis client because an engine's start
can block the event loop (vLLM's `AsyncLLM.from_engine_args` loads the model synchronously),
and an asyncio heartbeat would stall with it. SIGKILL ends the thread with the process, so the
key expires `HEARTBEAT_TTL_S` later. The worker also renews its health report here (`Names.health`,
same TTL): the health loop stalls with the event loop, and the launcher SIGKILLs a child whose report
goes missing (services/restarts.py: HangWatch). A SIGSTOPped starting worker stops both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import TracebackType

import redis

from shared.names import HEARTBEAT_TTL_S

log = logging.getLogger(__name__)


class StartupHeartbeat:
    """`with StartupHeartbeat(url, {key: incarnation}):` renews each key every TTL/3 until exit."""

    def __init__(self, redis_url: str, beats: Mapping[str, str], *, ttl_s: int = HEARTBEAT_TTL_S) -> None:
        self.beats = dict(beats)
        self.ttl_s = ttl_s
        self._client = redis.Redis.from_url(redis_url, socket_timeout=max(1.0, ttl_s / 3))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-heartbeat", daemon=True)

    def __enter__(self) -> StartupHeartbeat:
        self._beat()  # alive before the first engine starts, even if the thread is slow to run
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._beat()
            except redis.RedisError as exc:  # a missed beat is retried; the TTL covers two of them
                log.warning("start-up heartbeat failed: %r", exc)

    def _beat(self) -> None:
        with self._client.pipeline(transaction=False) as pipe:
            for key, incarnation in self.beats.items():
                pipe.set(key, incarnation, ex=self.ttl_s)
            pipe.execute()
