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
    if not heartbeat_keys:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        pipe.mget(list(heartbeat_keys))
        pipe.hmget(names.unresponsive, list(heartbeat_keys))
        beats, hung = await pipe.execute()
    return [beat is not None and beat != stuck for beat, stuck in zip(beats, hung, strict=True)]


async def serving(redis: aredis.Redis, names: Names, replica_ids: Sequence[str]) -> list[bool]:
    """For each replica, in order: is its worker alive and done starting (the incarnation beating is
    the one that wrote `worker_serving`)? A worker still starting its engine is alive but needs no
    weight sync: it loads the newest weights when it starts, then replays the commands sent meanwhile."""
    if not replica_ids:
        return []
    beat_keys = [names.worker_heartbeat(r) for r in replica_ids]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.mget(beat_keys)
        pipe.hmget(names.unresponsive, beat_keys)
        pipe.mget([names.worker_serving(r) for r in replica_ids])
        beats, hung, started = await pipe.execute()
    return [beat is not None and beat != stuck and beat == done
            for beat, stuck, done in zip(beats, hung, started, strict=True)]


async def clear_unresponsive(redis: aredis.Redis, names: Names, heartbeat_key: str) -> None:
    """The process behind `heartbeat_key` applied a command: it answers again (a recovered engine)."""
    await redis.hdel(names.unresponsive, heartbeat_key)


async def mark_unresponsive(redis: aredis.Redis, names: Names, heartbeat_key: str,
                            incarnation: bytes | str | None) -> None:
    """The process `incarnation` behind `heartbeat_key` let a command pass its deadline: gone from
    now on (a later incarnation is not affected)."""
    if incarnation is not None:
        await redis.hset(names.unresponsive, heartbeat_key, incarnation)
