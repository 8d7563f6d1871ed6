"""The message bus as the services see it: typed messages over Redis streams.

Where it sits: between the services and `shared.streams` (consumer groups,
replay, reclaim, dead letters). A service publishes dataclasses from
`shared.schema` and reads them back decoded; a malformed entry is
dead-lettered with its id and error and acked, so one bad message never
stops a loop and is never silently lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aredis

from shared import schema
from shared.names import DEAD_LETTER_MAXLEN, EVENT_STREAM_MAXLEN, MAX_DELIVERIES, STREAM_RETENTION_S, Names
from shared.streams import BLOCK_MS, StreamConsumer

log = logging.getLogger(__name__)


class Bus:
    """One Redis client plus the run's names, and how long its readers keep acked entries
    (``retention_s``, None: forever), how many dead letters (``dead_letter_maxlen``) and how many
    entries of each stream no group reads (``event_maxlen``: audit, metrics, controller:acks)."""

    def __init__(self, redis: aredis.Redis, names: Names, *, retention_s: float | None = STREAM_RETENTION_S,
                 dead_letter_maxlen: int = DEAD_LETTER_MAXLEN,
                 event_maxlen: int = EVENT_STREAM_MAXLEN) -> None:
        self.redis = redis
        self.names = names
        self.retention_s = retention_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self.event_maxlen = event_maxlen
        self.handled_ttl_s = int(max(STREAM_RETENTION_S, retention_s or 0))
        """How long a handled message's id is kept (Names.handled): as long as a copy can be read."""
        self._capped = frozenset((names.audit, names.metrics, names.controller_acks))
        """Streams without a consumer group: nothing trims them by acks, so each XADD caps them."""

    def _maxlen(self, stream: str) -> int | None:
        return self.event_maxlen if stream in self._capped else None

    async def publish(self, stream: str, message: schema.Message) -> str:
        entry_id = await self.redis.xadd(stream, schema.encode(message),  # type: ignore[arg-type]
                                         maxlen=self._maxlen(stream), approximate=True)
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def publish_many(self, items: Sequence[tuple[str, schema.Message]]) -> None:
        if not items:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, message in items:
                pipe.xadd(stream, schema.encode(message),  # type: ignore[arg-type]
                          maxlen=self._maxlen(stream), approximate=True)
            await pipe.execute()

    async def record(self, event: schema.AuditEvent) -> None:
        """Append a lifecycle event to the audit stream."""
        await self.publish(self.names.audit, event)

    async def serve_commands(self, sub: Subscription, stop: asyncio.Event, *, sender: str,
                             apply: Callable[[schema.Command], Awaitable[schema.Report | None]]) -> None:
        """Apply each Command in order and acknowledge it: ok with `apply`'s typed report, or not ok
        with the ValueError's text (unknown action, illegal in this state). A command is applied at
        most once per `command_id` (within the streams' retention): a copy gets the first ack again."""
        while not stop.is_set():
            for entry_id, message in await sub.read(count=16, block_ms=200):
                if isinstance(message, schema.Command):
                    await self._answer_once(message, sender, apply)
                await sub.ack(entry_id)

    async def _answer_once(self, command: schema.Command, sender: str,
                           apply: Callable[[schema.Command], Awaitable[schema.Report | None]]) -> None:
        handled_key = self.names.handled(sender, command.command_id)
        handled = await self.redis.hgetall(handled_key)  # type: ignore[misc]
        if handled:
            log.info("%s: %s %s was handled already; its ack is sent again", sender, command.action,
                     command.command_id)
            await self.publish(self.names.controller_acks, schema.decode(handled))
            return
        try:
            ack = schema.CommandAck.answer(command, sender=sender, report=await apply(command))
        except ValueError as exc:
            log.error("%s rejected %s %s: %s", sender, command.command_id, command.action, exc)
            ack = schema.CommandAck(command_id=command.command_id, sender=sender, ok=False, error=str(exc))
        fields = schema.encode(ack)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(handled_key, mapping=fields)
            pipe.expire(handled_key, self.handled_ttl_s)
            pipe.xadd(self.names.controller_acks, fields, maxlen=self._maxlen(self.names.controller_acks),
                      approximate=True)
            await pipe.execute()

    def consumer(self, stream: str, group: str, consumer: str) -> StreamConsumer:
        """A raw consumer of ``stream`` with this bus's dead letters, leases, retention and caps."""
        return StreamConsumer(self.redis, stream=stream, group=group, consumer=consumer,
                              max_deliveries=MAX_DELIVERIES, dead_letter_stream=self.names.dead_letters,
                              lease_key_prefix=self.names.lease(""), retention_s=self.retention_s,
                              dead_letter_maxlen=self.dead_letter_maxlen)

    async def subscribe(self, stream: str, group: str, consumer: str) -> Subscription:
        consumer_ = self.consumer(stream, group, consumer)
        await consumer_.start()
        return Subscription(self, consumer_)


class Subscription:
    """Decoded reads from one consumer group, with dead-lettering of malformed entries."""

    def __init__(self, bus: Bus, consumer: StreamConsumer) -> None:
        self.bus = bus
        self.consumer = consumer

    async def read(self, *, count: int = 64, block_ms: int = BLOCK_MS) -> list[tuple[str, schema.Message]]:
        """Decoded messages; own pending entries first after a restart (see shared.streams)."""
        entries = await self.consumer.read(count=count, block_ms=block_ms)
        decoded: list[tuple[str, schema.Message]] = []
        for entry in entries:
            try:
                decoded.append((entry.entry_id.decode(), schema.decode(entry.fields)))
            except Exception as exc:  # any failure to decode one entry fails that entry alone
                log.error("dead-lettering malformed entry %s on %s: %s", entry.entry_id, self.consumer.stream,
                          exc)
                await self.consumer.dead_letter(entry, reason=malformed_reason(exc))
        return decoded

    async def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            await self.consumer.ack(list(entry_ids))

    async def answer(self, stream: str, answers: Sequence[tuple[str, schema.Message]]) -> None:
        """Publish each answer to ``stream`` and ack the entry it answers, in one MULTI (one round
        trip for all): a crash leaves an answer sent and its entry acked, or neither (replayed)."""
        if answers:
            await self.consumer.publish_and_ack([entry_id for entry_id, _ in answers], stream,
                                                [schema.encode(message) for _, message in answers],
                                                maxlen=self.bus._maxlen(stream))

    async def close(self) -> None:
        await self.consumer.aclose()


def malformed_reason(exc: Exception) -> str:
    """The dead-letter reason of an entry that could not be decoded: the exception, named."""
    detail = str(exc) if isinstance(exc, schema.MalformedMessage) else f"{type(exc).__name__}: {exc}"
    return f"malformed: {detail}"


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
