"""Whether a peer process is alive: its heartbeat key is set and it has not been judged
unresponsive.

Where it sits: every wait on a worker (the controller's lifecycle commands, the trainer's weight
reload) and the load balancer's routing ask `alive` first. A worker is gone when its heartbeat
expired (killed, during start-up too) or when the incarnation now beating is the one that let a
command pass its deadline without an ack (`mark_unresponsive`; a hung engine keeps beating). A
restarted worker beats with a new incarnation, so it counts as alive again by itself; a worker
whose engine recovers clears the mark when it next applies a command (`clear_unresponsive`).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aredis

from shared.names import Names


async def alive(redis: aredis.Redis, names: Names, heartbeat_keys: Sequence[str]) -> list[bool]:
    """For each heartbeat key, in order: is its process alive? (one round trip)"""
    beating, _ = await _beating(redis, names, heartbeat_keys)
    return [incarnation is not None for incarnation in beating]


async def serving(redis: aredis.Redis, names: Names, replica_ids: Sequence[str]) -> list[bool]:
    """For each replica, in order: is its worker alive and done starting (the incarnation beating is
    the one that wrote `worker_serving`)? A worker still starting its engine is alive but needs no
    weight sync: it loads the newest weights when it starts, then replays the commands sent meanwhile."""
    beating, started = await _beating(redis, names, [names.worker_heartbeat(r) for r in replica_ids],
                                      also_get=[names.worker_serving(r) for r in replica_ids])
    return [incarnation is not None and incarnation == done
            for incarnation, done in zip(beating, started, strict=True)]


async def _beating(redis: aredis.Redis, names: Names, heartbeat_keys: Sequence[str],
                   also_get: Sequence[str] = ()) -> tuple[list[bytes | None], list[bytes | None]]:
    """For each heartbeat key, in order: the incarnation beating there, None where its process is
    gone (no beat, or the incarnation beating is marked unresponsive); and the values of the keys
    `also_get`, read in the same round trip."""
    if not heartbeat_keys:
        return [], []
    async with redis.pipeline(transaction=False) as pipe:
        pipe.mget(list(heartbeat_keys))
        pipe.hmget(names.unresponsive, list(heartbeat_keys))
        if also_get:
            pipe.mget(list(also_get))
        beats, hung, *also = await pipe.execute()
    return ([beat if beat != stuck else None for beat, stuck in zip(beats, hung, strict=True)],
            also[0] if also else [])


async def clear_unresponsive(redis: aredis.Redis, names: Names, heartbeat_key: str) -> None:
    """The process behind `heartbeat_key` applied a command: it answers again (a recovered engine)."""
    await redis.hdel(names.unresponsive, heartbeat_key)


async def mark_unresponsive(redis: aredis.Redis, names: Names, heartbeat_key: str,
                            incarnation: bytes | str | None) -> None:
    """The process `incarnation` behind `heartbeat_key` let a command pass its deadline: gone from
    now on (a later incarnation is not affected)."""
    if incarnation is not None:
        await redis.hset(names.unresponsive, heartbeat_key, incarnation)
