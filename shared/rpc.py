"""Controller -> peer commands over streams, with acknowledgements.

Where it sits: the controller's executor (and the trainer, for a weight push) sends a `Command` to a worker's,
the load balancer's or the rollouter's command stream and awaits the
matching `CommandAck` from `controller_acks`. Commands are idempotent, so a
command whose ack does not come within `timeout_s` is sent again (a peer
that restarted replays or receives it); after `max_attempts` the call fails
with CommandFailed, naming the peer and the action.

A call given the peer's lease key (a worker's heartbeat) ends with PeerGone as
soon as that key expires while it waits: the command stays in the peer's
stream and is replayed when the peer returns. `call_peers` treats such a peer as
not awaited, so a dying worker never fails its caller; a live peer that lets the
command pass its deadline unacked (a hung engine: it still beats) is marked
unresponsive (`shared.peer_liveness`), so it counts as gone until a new incarnation of
it beats, and is not awaited either. The ack reader skips any
entry it cannot decode (logged; the stream is read without a group, so there is
nothing to dead-letter or ack) and retries lost connections.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.bus import Bus, text
from shared.liveness import beat
from shared.peer_liveness import mark_unresponsive
from shared.schema import Command, CommandAck, CommandAction, decode
from shared.streams import raise_if_cancel_swallowed

log = logging.getLogger(__name__)
LEASE_POLL_S = 0.25
"""How often a call checks the peer's lease while it waits for the ack."""
READ_RETRY_S = 0.5
ACK_BLOCK_MS = 500
"""How long one read of the ack stream blocks: also how late a closed client's reader stops."""


class CommandFailed(RuntimeError):
    """A peer rejected a command or never acknowledged it."""


class PeerGone(CommandFailed):
    """The peer's lease expired while its ack was awaited (the command stays in its stream)."""


class NoAck(CommandFailed):
    """The peer never acknowledged the command within its attempts (its deadline)."""


class CommandClient:
    def __init__(self, bus: Bus, *, timeout_s: float = 60.0, max_attempts: int = 3) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self._waiting: dict[str, asyncio.Future[CommandAck]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Read acks from the current end of the stream (older acks belong to earlier commands)."""
        last = await self.bus.redis.xrevrange(self.bus.names.controller_acks, count=1)
        last_id = text(last[0][0]) if last else "0-0"
        self._reader = asyncio.create_task(self._read_acks(last_id))

    async def close(self) -> None:
        """Stop the ack reader and wait until it has (so the client can be closed after this). The
        reader re-raises a cancel redis-py swallowed in a blocking XREAD (redis/redis-py#2028,
        `shared.streams.raise_if_cancel_swallowed`) and also stops at its next read's end (within
        ACK_BLOCK_MS): before either, `close` could wait for ever (seen in a test with a worker serving
        on another client)."""
        self._closed = True
        if self._reader:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def call(self, stream: str, action: CommandAction, *, lease_key: str | None = None,
                   timeout_s: float | None = None, **fields: object) -> CommandAck:
        """Send and await the ack; CommandFailed when rejected, NoAck when never acked within
        `max_attempts` x `timeout_s` (default: the client's), PeerGone when `lease_key` (the peer's
        heartbeat) expires while waiting."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        command = _command(action, fields)
        future: asyncio.Future[CommandAck] = asyncio.get_running_loop().create_future()
        self._waiting[command.command_id] = future
        try:
            for attempt in range(1, self.max_attempts + 1):
                await self.bus.publish(stream, command)
                try:
                    # not wait_for: it can swallow a cancel on 3.11
                    async with asyncio.timeout(timeout_s):
                        ack = await self._await(future, stream, action, lease_key)
                except TimeoutError:
                    log.warning("no ack for %s on %s (attempt %d/%d)", command.action, stream, attempt,
                                self.max_attempts)
                    continue
                if not ack.ok:
                    raise CommandFailed(f"{ack.sender} rejected {command.action}: {ack.error}")
                return ack
            raise NoAck(f"no ack for {command.action} on {stream} after {self.max_attempts} attempts "
                        f"of {timeout_s:g}s")
        finally:
            self._waiting.pop(command.command_id, None)

    async def _await(self, future: asyncio.Future[CommandAck], stream: str, action: CommandAction,
                     lease_key: str | None) -> CommandAck:
        """The ack; PeerGone as soon as `lease_key` expires, CommandFailed if the ack reader died."""
        while True:
            beat()  # waiting on a peer is progress of the caller's loop while the peer is alive
            done, _ = await asyncio.wait({future}, timeout=LEASE_POLL_S)  # wait() never cancels it
            if done:
                return future.result()
            if self._reader is not None and self._reader.done():
                raise CommandFailed(f"the ack reader stopped; {action} on {stream} cannot be acked")
            if lease_key is not None and not await self.bus.redis.exists(lease_key):
                raise PeerGone(f"{lease_key} expired while {action} on {stream} waited for its ack")

    async def call_peers(self, peers: list[tuple[str, str]], action: CommandAction, *,
                         deadline_s: float | None = None, **fields: object) -> list[CommandAck | None]:
        """`call` each (stream, lease key) concurrently, each within `deadline_s` (default: the
        client's attempts x timeout); None for a peer whose lease expired while it was awaited (it
        replays the command when it returns), and for one that let the deadline pass (marked
        unresponsive: gone until a new incarnation of it beats)."""
        timeout_s = None if deadline_s is None else deadline_s / self.max_attempts

        async def one(stream: str, lease_key: str) -> CommandAck | None:
            incarnation = await self.bus.redis.get(lease_key)
            try:
                return await self.call(stream, action, lease_key=lease_key, timeout_s=timeout_s, **fields)
            except PeerGone as exc:
                log.warning("%s: not awaited; replayed when the peer returns", exc)
                return None
            except NoAck as exc:
                log.error("%s: %s is unresponsive, counted as gone until it restarts", exc, lease_key)
                await mark_unresponsive(self.bus.redis, self.bus.names, lease_key, incarnation)
                return None
        return list(await asyncio.gather(*(one(stream, key) for stream, key in peers)))

    async def send(self, stream: str, action: CommandAction, **fields: object) -> None:
        """Publish without waiting for an ack (to a peer that is down: it replays it on restart)."""
        await self.bus.publish(stream, _command(action, fields))

    async def _read_acks(self, last_id: str) -> None:
        stream = self.bus.names.controller_acks
        reader = self.bus.redis
        while not self._closed:
            try:
                reply: Any = await reader.xread({stream: last_id}, count=256, block=ACK_BLOCK_MS)
                raise_if_cancel_swallowed()
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("reading %s failed (%r); retrying in %.1fs", stream, exc, READ_RETRY_S)
                await asyncio.sleep(READ_RETRY_S)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = text(entry_id)
                    try:
                        ack = decode(fields)
                    except Exception as exc:  # one bad entry is skipped, never fatal to the reader
                        log.error("ignoring malformed ack %s: %r", last_id, exc)
                        continue
                    if not isinstance(ack, CommandAck):
                        continue
                    future = self._waiting.get(ack.command_id)
                    if future is not None and not future.done():
                        future.set_result(ack)


def _command(action: CommandAction, fields: dict[str, object]) -> Command:
    return Command(command_id=uuid.uuid4().hex, action=action,
                   **fields)  # type: ignore[arg-type]
