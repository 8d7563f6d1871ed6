"""The trainer's end of a weight push: vLLM's weight-sync client over worker command streams.

Where it sits: when the controller asks the trainer to sync replicas that have a push
transport (command `sync_weights` on `trainer:commands`), the trainer runs vLLM's
trainer-side transfer engine (shared/weight_transfer.py) in a thread; the engine
drives the inference side through a client with four calls (vLLM's `VLLMWeightSyncClient`).
This client sends each call as a command to every target worker (`weights_init`,
`weights_start`, `weights_update`, `weights_finish`) and returns when all have acked, so the
order vLLM's engine relies on holds (e.g. every worker has started before any update).

The commands go out on the trainer's event loop; the calls block the transfer thread only.
A call is sent once (not retried: a resent update would wait for a broadcast that never
comes); a worker that fails, does not answer within the timeout, or dies meanwhile (its
heartbeat expires or changes) fails the push, and the trainer falls back to the filesystem.
A failed call also aborts the push (SyncClient.abort), so `weight_transfer.send_within` aborts
the communicator under a broadcast still waiting for the dead worker. Each step names the worker
process it is for (`weight_transfer.TARGET_KEY`): a restarted worker refuses the old group's steps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shared.bus import text
from shared.names import Names
from shared.rpc import CommandClient
from shared.schema import PUSH_ACTIONS, CommandAction, PushStep
from shared.streams import raise_if_cancel_swallowed
from shared.weight_transfer import TARGET_KEY, SyncClient

WATCH_INTERVAL_S = 0.5
"""How often a waiting push checks that its targets' workers are still the ones it started with."""


class StreamSyncClient(SyncClient):
    """Over the target workers' command streams, pushing weights `version`."""

    def __init__(self, *, rpc: CommandClient, names: Names, loop: asyncio.AbstractEventLoop,
                 replica_ids: list[str], version: int, replica_world_size: int = 1,
                 incarnations: tuple[str, ...] = (), timeout_s: float = 300.0) -> None:
        super().__init__()
        self.rpc = rpc
        self.names = names
        self.loop = loop
        self.replica_ids = list(replica_ids)
        self.version = version
        self.replica_world_size = replica_world_size
        self.incarnations = incarnations
        """The targets' worker processes (heartbeat values): the trainer forms its push group
        anew when they change, i.e. when a replica restarted."""
        self.timeout_s = timeout_s

    def _send(self, step: PushStep, payloads: list[dict[str, Any]]) -> None:
        """Called from the transfer thread: run the fan-out on the loop, block until it is done
        (or the push is aborted)."""
        if self.incarnations:
            payloads = [{**p, TARGET_KEY: i} if i else p
                        for p, i in zip(payloads, self.incarnations, strict=True)]
        fan_out = self._fan_out(PUSH_ACTIONS[step], payloads)
        self._wait(step, asyncio.run_coroutine_threadsafe(fan_out, self.loop))

    async def _fan_out(self, action: CommandAction, payloads: list[dict[str, Any]]) -> None:
        """Send `action` to every target and wait for all acks, but give up as soon as a target's
        worker is gone (heartbeat expired, or a new incarnation): it would never answer."""
        calls: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(
            self.rpc.call(self.names.worker_commands(replica_id), action, version=self.version, data=payload)
            for replica_id, payload in zip(self.replica_ids, payloads, strict=True))))
        watch: asyncio.Future[Any] = asyncio.ensure_future(self._watch_targets(action))
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.wait({calls, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                watch.result()
            await calls
        finally:
            for task in (calls, watch):
                task.cancel()
            await asyncio.gather(calls, watch, return_exceptions=True)

    async def _watch_targets(self, action: CommandAction) -> None:
        keys = [self.names.worker_heartbeat(r) for r in self.replica_ids]
        expected = self.incarnations or (None,) * len(keys)
        while True:
            beats = await self.rpc.bus.redis.mget(keys)
            # `_fan_out` cancels this watch once the acks are in, then awaits it: a cancel redis-py
            # swallowed in the MGET (redis/redis-py#2028) kept it looping, and the push waiting, for ever
            raise_if_cancel_swallowed()
            for replica_id, beat, incarnation in zip(self.replica_ids, beats, expected, strict=True):
                if beat is None or (incarnation is not None and text(beat) != incarnation):
                    raise ValueError(f"{replica_id}'s worker stopped or restarted during {action}")
            await asyncio.sleep(WATCH_INTERVAL_S)
