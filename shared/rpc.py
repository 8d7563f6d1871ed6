"""Controller -> peer commands over streams, with acknowledgements.

Where it sits: the controller's executor (and the trainer, for a weight push) sends a `Command` to a worker's,
the load balancer's or the rollouter's command stream and awaits the
matching `CommandAck` from `controller_acks`. Commands are idempotent, so a
command whose ack does not come within `timeout_s` is sent again (a peer
that restarted replays or receives it); after `max_attempts` the call fails
with CommandFailed, naming the peer and the action.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from shared.bus import Bus, text
from shared.schema import Command, CommandAck, CommandAction, MalformedMessage, decode

log = logging.getLogger(__name__)


class CommandFailed(RuntimeError):
    """A peer rejected a command or never acknowledged it."""


class CommandClient:
    def __init__(self, bus: Bus, *, timeout_s: float = 60.0, max_attempts: int = 3) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self._waiting: dict[str, asyncio.Future[CommandAck]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read acks from the current end of the stream (older acks belong to earlier commands)."""
        last = await self.bus.redis.xrevrange(self.bus.names.controller_acks, count=1)
        last_id = text(last[0][0]) if last else "0-0"
        self._reader = asyncio.create_task(self._read_acks(last_id))

    async def close(self) -> None:
        if self._reader:
            self._reader.cancel()

    async def call(self, stream: str, action: CommandAction, **fields: object) -> CommandAck:
        """Send and await the ack; CommandFailed when rejected or never acked."""
        command = _command(action, fields)
        future: asyncio.Future[CommandAck] = asyncio.get_running_loop().create_future()
        self._waiting[command.command_id] = future
        try:
            for attempt in range(1, self.max_attempts + 1):
                await self.bus.publish(stream, command)
                try:
                    # not wait_for: it can swallow a cancel on 3.11
                    async with asyncio.timeout(self.timeout_s):
                        ack = await asyncio.shield(future)
                except TimeoutError:
                    log.warning("no ack for %s on %s (attempt %d/%d)", command.action, stream, attempt,
                                self.max_attempts)
                    continue
                if not ack.ok:
                    raise CommandFailed(f"{ack.sender} rejected {command.action}: {ack.error}")
                return ack
            raise CommandFailed(f"no ack for {command.action} on {stream} after {self.max_attempts} attempts")
        finally:
            self._waiting.pop(command.command_id, None)

    async def send(self, stream: str, action: CommandAction, **fields: object) -> None:
        """Publish without waiting for an ack (to a peer that is down: it replays it on restart)."""
        await self.bus.publish(stream, _command(action, fields))

    async def call_many(self, streams: list[str], action: CommandAction,
                        **fields: object) -> list[CommandAck]:
        return list(await asyncio.gather(*(self.call(s, action, **fields) for s in streams)))

    async def _read_acks(self, last_id: str) -> None:
        stream = self.bus.names.controller_acks
        reader = self.bus.redis
        while True:
            reply: Any = await reader.xread({stream: last_id}, count=256, block=500)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = text(entry_id)
                    try:
                        ack = decode(fields)
                    except MalformedMessage as exc:
                        log.error("ignoring malformed ack %s: %s", last_id, exc)
                        continue
                    if not isinstance(ack, CommandAck):
                        continue
                    future = self._waiting.get(ack.command_id)
                    if future is not None and not future.done():
                        future.set_result(ack)


def _command(action: CommandAction, fields: dict[str, object]) -> Command:
    return Command(command_id=uuid.uuid4().hex, action=action,
                   **fields)  # type: ignore[arg-type]
