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
