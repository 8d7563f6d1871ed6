"""Consumer-group and stream-size helpers: create a group, append in bulk, measure what is left.

Where it sits: services and the stream consumer (`shared.streams`) call these
with names from `shared/names.py`. `group_lag` of the MessageQueue is the
system's `mq_size`: samples not yet taken by the trainer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from shared.redis_client import as_str

_PAGE = 1000

Fields = Mapping[Any, bytes | str | int | float]  # keys: bytes or str (Mapping keys are invariant)


async def ensure_group(r: aredis.Redis, stream: str, group: str, *, start_id: str = "0") -> bool:
    """Create ``group`` on ``stream`` (and the stream); True if created, False if it existed.

    ``start_id="0"`` makes a new group see entries written before it existed,
    so samples produced before the trainer started are not skipped.
    """
    try:
        await r.xgroup_create(stream, group, id=start_id, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
        return False
    return True


async def xadd_many(r: aredis.Redis, stream: str, entries: Iterable[Fields], *,
                    chunk_size: int = 256) -> list[bytes]:
    """XADD every entry in order, pipelined ``chunk_size`` at a time; returns the ids."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids: list[bytes] = []
    pipe = r.pipeline(transaction=False)
    pending = 0
    for fields in entries:
        pipe.xadd(stream, dict(fields))  # type: ignore[arg-type]
        pending += 1
        if pending == chunk_size:
            ids.extend(await pipe.execute())
            pending = 0
    if pending:
        ids.extend(await pipe.execute())
    return ids


async def group_lag(r: aredis.Redis, stream: str, group: str) -> int:
    """Entries in ``stream`` not yet delivered to ``group`` (its ``lag``).

    For the MessageQueue this is ``mq_size``: samples not yet taken by the
    trainer. A missing stream counts 0, a missing group counts every entry.
    Falls back to counting entries after ``last-delivered-id`` when Redis
    cannot compute ``lag`` (entries deleted mid-stream, or Redis < 7).
    """
    try:
        groups = await r.xinfo_groups(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return 0
        raise
    for info in groups:
        if as_str(info["name"]) != group:
            continue
        lag = info.get("lag")
        if lag is not None:
            return int(lag)
        return await _count_after(r, stream, as_str(info["last-delivered-id"]))
    return int(await r.xlen(stream))


async def _count_after(r: aredis.Redis, stream: str, last_id: str) -> int:
    count, cursor = 0, f"({last_id}"  # exclusive range start
    while True:
        page: Any = await r.xrange(stream, min=cursor, max="+", count=_PAGE)
        count += len(page)
        if len(page) < _PAGE:
            return count
        cursor = f"({as_str(page[-1][0])}"


async def group_pending(r: aredis.Redis, stream: str, group: str) -> int:
    """Entries delivered to ``group`` and not yet acked (taken, not finished)."""
    summary = await r.xpending(stream, group)
    return int(summary["pending"])


async def trim_acked(r: aredis.Redis, stream: str, *, retention_s: float) -> int:
    """XTRIM MINID: delete the entries every consumer group of ``stream`` has acked and that are older
    than ``retention_s`` (by their id's timestamp, on Redis's clock); how many were deleted.

    An entry is acked by a group when it is below both the group's oldest pending entry and its
    ``last-delivered-id``; an entry no group has read, or one still pending anywhere, is never
    deleted. A stream without groups is left alone (its readers are not known). Safe against
    concurrent readers: deliveries only move past the bound, acks only lower what is pending.
    """
    try:
        groups = await r.xinfo_groups(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return 0
        raise
    if not groups:
        return 0
    seconds, micros = await r.time()
    bound = (int(seconds) * 1000 + int(micros) // 1000 - int(retention_s * 1000), 0)
    for info in groups:
        bound = min(bound, _next_id(as_str(info["last-delivered-id"])))
        if int(info["pending"]) > 0:
            oldest = (await r.xpending(stream, as_str(info["name"])))["min"]
            if oldest is not None:
                bound = min(bound, _parse_id(as_str(oldest)))
    if bound <= (0, 0):
        return 0
    return int(await r.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=False))


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: str) -> tuple[int, int]:
    ms, seq = _parse_id(entry_id)
    return ms, seq + 1
