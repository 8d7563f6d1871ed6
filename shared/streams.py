"""The stream consumer every service reads with: the bus of the system.

Where it sits: every exchange between services (generation requests, results,
samples into the MessageQueue, commands, acks) is a stream entry read through
a consumer group. Only this module issues XREADGROUP/XACK/XCLAIM/XPENDING;
callers pass stream, group and key names (from ``shared/names.py``). The
client (``connect``, timeouts) lives in ``shared/redis_client.py``, the group
and size helpers (``ensure_group``, ``xadd_many``, ``group_lag``,
``group_pending``) in ``shared/stream_groups.py``; both are re-exported here.

Delivery is at-least-once (duplicates must be harmless upstream):

1. Stable consumer names. After a (re)start, or a connection error that may
   have lost a reply, ``read`` first replays the consumer's own pending
   entries (id ``0``, skipping those it still holds), one per read so that
   delivery counts are judged per entry, then reads ``>``.
2. Liveness is a lease key with a TTL, renewed while reading. ``reclaim_dead``
   claims only entries of consumers whose lease expired, never by idle time,
   and hands them out like a restart's own pending ones (one per read).
3. Past ``max_deliveries`` an entry moves to a dead-letter stream with
   ``dlq_*`` reason/origin fields and is acked.
4. Blocking reads get their own connection and ``BLOCK_MS`` well below the
   socket timeout. A lost connection is retried for the client's retry window
   (``run.redis_retry_window_s``) from its first failure, then the read raises (sooner once the
   process is stopping: ``shared.redis_client.StopClock``).
5. Bounded memory: every ``TRIM_INTERVAL_S`` a read trims its stream below the
   oldest entry any group still needs (``trim_acked``: XTRIM MINID), keeping
   acked entries younger than ``retention_s``. Sample streams are never
   MAXLEN-trimmed: the MessageQueue is bounded by the rollouter's backpressure,
   measured with ``group_lag``. The dead-letter stream keeps a capped copy:
   about ``dead_letter_maxlen`` entries (MAXLEN ~), each field cut at
   ``DEAD_LETTER_FIELD_MAX_BYTES``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.liveness import beat
from shared.names import DEAD_LETTER_FIELD_MAX_BYTES, DEAD_LETTER_MAXLEN, STREAM_RETENTION_S, Names
from shared.redis_client import BLOCK_MS as BLOCK_MS
from shared.redis_client import PROCESS_STOP, dedicated_client, retry_window_s
from shared.redis_client import SOCKET_TIMEOUT_S as SOCKET_TIMEOUT_S
from shared.redis_client import as_bytes as _b
from shared.redis_client import as_str as _s
from shared.redis_client import connect as connect
from shared.stream_groups import Fields as Fields
from shared.stream_groups import ensure_group as ensure_group
from shared.stream_groups import group_lag as group_lag
from shared.stream_groups import group_pending as group_pending
from shared.stream_groups import trim_acked
from shared.stream_groups import xadd_many as xadd_many

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_LEASE_KEY_PREFIX = Names().lease("")  # lease key = prefix + consumer
DEFAULT_MAX_DELIVERIES = 5
DEAD_LETTER_SUFFIX = ":dlq"  # default dead-letter stream = origin stream + suffix
TRIM_INTERVAL_S = 1.0  # a reader trims its stream at most this often

EntryId = bytes | str
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One delivered stream entry."""

    entry_id: bytes  # Redis stream id, e.g. b"1718000000000-0"
    fields: dict[bytes, bytes]  # raw field/value bytes as written by the producer
    deliveries: int  # times delivered to the group, this delivery included



class StreamConsumer:
    """One stable-named consumer of one consumer group.

    Loop: ``start()``, then ``read()`` / process / ``ack()``, ``aclose()`` at the end;
    call ``reclaim_dead()`` now and then (its entries then come from ``read()``). On a
    crash nothing is lost: unacked entries stay pending under this consumer name; a
    restart replays them, and if the process never returns another consumer claims
    them once the lease has expired.
    """

    def __init__(self, r: aredis.Redis, *, stream: str, group: str, consumer: str,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S, lease_key_prefix: str = DEFAULT_LEASE_KEY_PREFIX,
                 dead_letter_stream: str | None = None, max_deliveries: int = DEFAULT_MAX_DELIVERIES,
                 retention_s: float | None = STREAM_RETENTION_S,
                 dead_letter_maxlen: int = DEAD_LETTER_MAXLEN) -> None:
        """``retention_s=None`` never trims the stream."""
        if not consumer:
            raise ValueError("consumer name must be non-empty and stable across restarts")
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {max_deliveries}")
        if retention_s is not None and retention_s < 0:
            raise ValueError(f"retention_s must be >= 0, got {retention_s}")
        if dead_letter_maxlen < 1:
            raise ValueError(f"dead_letter_maxlen must be >= 1, got {dead_letter_maxlen}")
        self.r = r
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.lease_ttl_s = lease_ttl_s
        self.lease_key_prefix = lease_key_prefix
        self.dead_letter_stream = dead_letter_stream or stream + DEAD_LETTER_SUFFIX
        self.max_deliveries = max_deliveries
        self.retention_s = retention_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self._trimmed_at_s = float("-inf")
        self._reachable = True  # False while the last read failed to reach Redis
        self.trimmed = 0
        self._reader = dedicated_client(r)
        self._replay_cursor: bytes | None = b"0"  # None once the own PEL is drained
        self._outstanding: set[bytes] = set()  # handed to the caller, not yet acked
        self._lease_renewed_at_s = float("-inf")
        self.dead_lettered = 0
        self.deleted_pending = 0
        self.reclaimed = 0

    def lease_key(self, consumer: str | None = None) -> str:
        return self.lease_key_prefix + (consumer or self.consumer)

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Create the group if needed and take the lease."""
        await ensure_group(self.r, self.stream, self.group)
        await self.renew_lease()

    async def renew_lease(self) -> None:
        """Extend this consumer's lease by ``lease_ttl_s``. Reads renew it; long work should too."""
        await self.r.set(self.lease_key(), b"1", px=max(1, int(self.lease_ttl_s * 1000)))
        self._lease_renewed_at_s = time.monotonic()

    async def _renew_lease_if_due(self) -> None:
        if time.monotonic() - self._lease_renewed_at_s >= self.lease_ttl_s / 3:
            await self.renew_lease()

    async def aclose(self, *, release_lease: bool = False) -> None:
        """Close the reader connection; ``release_lease`` lets others reclaim at once. A clean stop
        (the last read reached Redis) trims the stream a last time."""
        if self._reachable and self.retention_s is not None:
            self._trimmed_at_s = float("-inf")
            try:
                await self._trim_if_due()
            except RedisError as exc:  # a stop must not fail on housekeeping
                log.warning("last trim of %s failed: %r", self.stream, exc)
        if release_lease:
            await self.r.delete(self.lease_key())
        await self._reader.aclose()

    def rewind(self) -> None:
        """Replay this consumer's pending entries (not the outstanding ones) at the next read."""
        self._replay_cursor = b"0"

    # -- reading ---------------------------------------------------------------

    async def read(self, count: int = 128, block_ms: int = BLOCK_MS) -> list[StreamEntry]:
        """Up to ``count`` entries: own pending ones first, then new ones.

        ``block_ms=0`` does not block. Entries past ``max_deliveries`` are
        dead-lettered instead of returned; entries deleted while pending are
        acked and skipped.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        beat()  # a loop that reads is a loop that makes progress (shared.liveness)
        timeout_s = self.r.connection_pool.connection_kwargs.get("socket_timeout")
        if block_ms < 0 or (timeout_s is not None and block_ms >= timeout_s * 1000 / 2):
            raise ValueError(f"block_ms={block_ms} must be >= 0 and below half the socket timeout "
                             f"{timeout_s}s")
        first_failure_s: float | None = None
        delay_s = 0.05
        while True:
            try:
                await self._renew_lease_if_due()
                await self._trim_if_due()
                if self._replay_cursor is not None:
                    replayed = await self._replay(count)
                    if replayed:
                        self._reachable = True
                        return replayed
                entries = await self._read_new(count, block_ms)
                raise_if_cancel_swallowed()  # rewound below: the entries stay pending for this consumer
                self._reachable = True
                return entries
            except ResponseError as exc:
                # UNBLOCKED: the stream was deleted while this read blocked on it (Redis 7)
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                log.warning("group %s on %s vanished (deleted by hand, or Redis lost data?); recreating",
                            self.group, self.stream)
                await ensure_group(self.r, self.stream, self.group)
            except asyncio.CancelledError:
                self.rewind()  # a cancelled blocking read may have had entries delivered
                raise
            except _TRANSIENT as exc:
                self.rewind()  # the lost reply may have delivered entries to us
                self._reachable = False
                now_s = time.monotonic()
                first_failure_s = now_s if first_failure_s is None else first_failure_s
                if now_s >= PROCESS_STOP.deadline_s(first_failure_s, retry_window_s(self.r)):
                    raise
                log.warning("read on %s/%s failed (%r); retrying in %.2fs", self.stream, self.consumer, exc,
                            delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(1.0, delay_s * 2)

    async def _trim_if_due(self) -> None:
        if self.retention_s is None or time.monotonic() - self._trimmed_at_s < TRIM_INTERVAL_S:
            return
        self._trimmed_at_s = time.monotonic()
        self.trimmed += await trim_acked(self.r, self.stream, retention_s=self.retention_s)

    async def _read_new(self, count: int, block_ms: int) -> list[StreamEntry]:
        resp = await self._reader.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count,
                                             block=block_ms or None)
        entries = [StreamEntry(_b(eid), fields or {}, 1) for eid, fields in _only_stream(resp)]
        self._outstanding.update(e.entry_id for e in entries)
        return entries

    async def _replay(self, count: int) -> list[StreamEntry]:
        """One own pending entry at a time (``count`` is ignored): XREADGROUP from an id charges a
        delivery to every entry it returns, so replaying a page would charge the entries after one
        that crashes the process too, and dead-letter them with it. One at a time, delivery counts
        are judged per entry: only the entry being handled when the process dies is charged again."""
        del count
        while self._replay_cursor is not None:
            resp = await self._reader.xreadgroup(self.group, self.consumer,
                                                 {self.stream: self._replay_cursor}, count=1)
            page = _only_stream(resp)
            if not page:
                self._replay_cursor = None
                break
            self._replay_cursor = _b(page[-1][0])
            pend = await self.r.xpending_range(self.stream, self.group, min=page[0][0], max=page[-1][0],
                                               count=len(page), consumername=self.consumer)
            deliveries = {_b(p["message_id"]): int(p["times_delivered"]) for p in pend}
            fresh = [(_b(eid), fields, deliveries.get(_b(eid), 1))
                     for eid, fields in page if _b(eid) not in self._outstanding]
            kept = await self._screen(fresh)
            if kept:
                return kept
        return []

    async def _screen(self,
                      candidates: Sequence[tuple[bytes, dict[bytes, bytes] | None,
                                                 int]]) -> list[StreamEntry]:
        """Ack deleted entries, dead-letter over-delivered ones, return the rest."""
        kept: list[StreamEntry] = []
        deleted: list[bytes] = []
        for entry_id, fields, deliveries in candidates:
            if not fields:  # XADD needs >= 1 field: empty means deleted while pending
                deleted.append(entry_id)
            elif deliveries > self.max_deliveries:
                await self.dead_letter(StreamEntry(entry_id, fields, deliveries), reason="max_deliveries")
            else:
                kept.append(StreamEntry(entry_id, fields, deliveries))
        if deleted:
            log.warning("acking %d entries of %s deleted while pending: %s", len(deleted), self.stream,
                        deleted)
            await self.r.xack(self.stream, self.group, *deleted)
            self.deleted_pending += len(deleted)
        self._outstanding.update(e.entry_id for e in kept)
        return kept

    # -- acking / dead letters -----------------------------------------------------

    async def ack(self, ids: Iterable[EntryId]) -> int:
        """XACK ``ids`` in one call; returns how many were still pending."""
        id_list = [_b(i) for i in ids]
        if not id_list:
            return 0
        self._outstanding.difference_update(id_list)
        return int(await self.r.xack(self.stream, self.group, *id_list))

    async def publish_and_ack(self, ids: Sequence[EntryId], stream: str,
                              answers: Sequence[Fields], *, maxlen: int | None = None) -> None:
        """XADD ``answers`` to ``stream`` and XACK ``ids``, atomically (MULTI), in one round trip:
        a crash leaves the answers sent and the entries acked, or neither (the entries replay)."""
        id_list = [_b(i) for i in ids]
        pipe = self.r.pipeline(transaction=True)
        for fields in answers:
            pipe.xadd(stream, fields, maxlen=maxlen, approximate=True)  # type: ignore[arg-type]
        if id_list:
            pipe.xack(self.stream, self.group, *id_list)
        await pipe.execute()
        self._outstanding.difference_update(id_list)

    async def dead_letter(self, entry: StreamEntry, *, reason: str) -> bytes:
        """Move ``entry`` to the dead-letter stream and ack it, atomically (MULTI)."""
        fields: dict[bytes, bytes | str | int] = capped_copy(entry.fields)
        fields.update({b"dlq_reason": reason, b"dlq_stream": self.stream, b"dlq_group": self.group,
                       b"dlq_id": entry.entry_id, b"dlq_consumer": self.consumer,
                       b"dlq_deliveries": entry.deliveries})
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.dead_letter_stream, fields, maxlen=self.dead_letter_maxlen,  # type: ignore[arg-type]
                  approximate=True)
        pipe.xack(self.stream, self.group, entry.entry_id)
        dlq_id, _ = await pipe.execute()
        self._outstanding.discard(entry.entry_id)
        self.dead_lettered += 1
        log.error("dead-lettered %s from %s/%s after %d deliveries (%s) -> %s",
                  entry.entry_id, self.stream, self.group, entry.deliveries, reason, self.dead_letter_stream)
        return bytes(dlq_id)

    # -- reclaim -------------------------------------------------------------------

    async def dead_consumers(self, *, also: Collection[str] = ()) -> list[str]:
        """Other consumers of the group with pending entries and no live lease (or named in `also`:
        judged gone by the caller, e.g. a hung process whose lease is still renewed)."""
        infos = await self.r.xinfo_consumers(self.stream, self.group)
        names = [_s(i["name"]) for i in infos if int(i["pending"]) > 0 and _s(i["name"]) != self.consumer]
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.exists(self.lease_key(name))
        alive = await pipe.execute()
        return [name for name, is_alive in zip(names, alive, strict=True) if not is_alive or name in also]

    async def reclaim_dead(self, count: int = 100, *, also: Collection[str] = ()) -> int:
        """Take over up to ``count`` pending entries of consumers whose lease expired (or named in
        ``also``); returns how many. ``read()`` then hands them out like this consumer's own
        pending entries after a restart: one per read, each charged a delivery only when handed
        out, so a crash while handling one reclaimed entry never charges the others (the claim
        itself is JUSTID, which charges nothing).

        XAUTOCLAIM cannot filter by owner, so this lists a dead owner's entries
        with XPENDING and XCLAIMs them with ``min-idle`` = the smallest idle
        time seen: an entry someone else claimed meanwhile has a reset idle
        time and is skipped (compare-and-swap). Entries deleted while pending
        are dropped from the PEL by Redis 7 (acked by the replay on older servers).
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        await self.renew_lease()
        claimed = 0
        for owner in await self.dead_consumers(also=also):
            pend = await self.r.xpending_range(self.stream, self.group, min="-", max="+",
                                               count=count - claimed, consumername=owner)
            if not pend:
                continue
            min_idle_ms = max(1, min(int(p["time_since_delivered"]) for p in pend))
            got: Any = await self.r.xclaim(self.stream, self.group, self.consumer, min_idle_ms,
                                           [p["message_id"] for p in pend], justid=True)
            claimed += len(got)
            self.reclaimed += len(got)
            if got:
                log.warning("reclaimed %d entries of dead consumer %s on %s", len(got), owner, self.stream)
            if claimed >= count:
                break
        if claimed:
            self.rewind()
        return claimed


def capped_copy(fields: dict[bytes, bytes]) -> dict[bytes, bytes | str | int]:
    """``fields`` with each value cut at DEAD_LETTER_FIELD_MAX_BYTES; ``dlq_truncated`` names the cut ones."""
    cap = DEAD_LETTER_FIELD_MAX_BYTES
    copy: dict[bytes, bytes | str | int] = {k: v[:cap] for k, v in fields.items()}
    if cut := [k for k, v in fields.items() if len(v) > cap]:
        copy[b"dlq_truncated"] = b",".join(cut)
    return copy


def _only_stream(resp: Any) -> list[tuple[Any, dict[bytes, bytes] | None]]:
    """The entry list of a one-stream XREADGROUP reply (RESP2 list or RESP3 dict)."""
    if not resp:
        return []
    if isinstance(resp, dict):
        return list(next(iter(resp.values()))[0])
    return list(resp[0][1])


def raise_if_cancel_swallowed() -> None:
    """Raise the cancel a Redis call swallowed: redis-py's asyncio client can absorb a `CancelledError`
    that lands while it waits for a reply (redis/redis-py#2028), so a loop cancelled from outside (by its
    task group, shared.runtime.supervise, or by the caller that then awaits it) would run on and its
    awaiter would wait for ever. The task still counts the cancel (`cancelling()`). Call it right after
    the call in loops whose task is only ever cancelled from outside, not in cleanup that runs Redis
    calls while its task is being cancelled."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
