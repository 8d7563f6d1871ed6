"""Carries out the controller core's commands against the live services, in order.

Where it sits: `core.controller.ControllerCore` decides *what* happens and in
which order; this module does it over the bus: load-balancer membership,
worker lifecycle commands, the rollouter's replica count and staleness reset,
and the wait for enough samples. Every command is idempotent, so the same
list can be re-executed after a controller crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core import controller as cc
from shared.bus import Bus, text
from shared.names import TRAINER_GROUP
from shared.rpc import CommandClient
from shared.streams import group_lag
from shared.weight_transfer import push_groups

log = logging.getLogger(__name__)
POLL_S = 0.05


@dataclass
class ExecutionReport:
    """What executing one command list measured."""

    wait_for_enough_samples_s: float = 0.0
    switch_s: float = 0.0
    """Time in lifecycle commands (remove/abort/sleep or wake/sync-hybrids/add/resume/rebalance)."""
    standalone_sync_s: float = 0.0
    trainer_release_s: float = 0.0
    """Time the trainer took to offload before the hybrids woke (not part of switch_s)."""
    pushes: int = 0
    push_fallbacks: int = 0
    rollouter_report: dict[str, Any] = field(default_factory=dict)


Push = Callable[[tuple[str, ...], int, str], Awaitable[bool]]


class Executor:
    def __init__(self, *, bus: Bus, rpc: CommandClient, standalone_ids: tuple[str, ...],
                 weights_path: str = "", force_event: asyncio.Event | None = None,
                 transports: dict[str, str] | None = None) -> None:
        self.bus = bus
        self.rpc = rpc
        self.standalone_ids = standalone_ids
        self.weights_path = weights_path
        self.transports = transports or {}
        """replica id -> its push transport; absent: filesystem only."""
        self.serving_hybrids: tuple[str, ...] = ()
        self.force_event = force_event or asyncio.Event()
        self.release_trainer: Callable[[], Awaitable[None]] | None = None
        """Set for an activation: asks the trainer to offload; run once, just before the wake."""
        self.push: Push | None = None
        """Set for a sync: asks the trainer to push (replica ids, version, transport); True if it did."""

    async def execute(self, commands: list[cc.Command]) -> ExecutionReport:
        report = ExecutionReport()
        for command in commands:
            started = time.monotonic()
            released_before = report.trainer_release_s
            await self._run(command, report)
            elapsed = time.monotonic() - started - (report.trainer_release_s - released_before)
            if isinstance(command, cc.WaitForSamples):
                report.wait_for_enough_samples_s += elapsed
            elif isinstance(command, cc.SyncWeights) and command.replica_ids == self.standalone_ids:
                report.standalone_sync_s += elapsed
            elif not isinstance(command, cc.ResetStaleness):
                report.switch_s += elapsed
            await self.bus.audit(kind="command", subject="controller", detail=f"{command.kind} "
                                 f"{getattr(command, 'replica_ids', '')} {elapsed:.3f}s",
                                 version=getattr(command, "version", -1))
        return report

    async def _run(self, command: cc.Command, report: ExecutionReport) -> None:
        names = self.bus.names
        if isinstance(command, cc.WaitForSamples):
            await self.wait_for_samples(command.min_queue_size)
        elif isinstance(command, cc.RemoveReplicas | cc.AddReplicas):
            action = "remove" if isinstance(command, cc.RemoveReplicas) else "add"
            ack = await self.rpc.call(names.lb_commands, action, replica_ids=list(command.replica_ids))
            members = ack.data.get("members", [])
            self.serving_hybrids = tuple(m for m in members if m not in self.standalone_ids)
            await self.rpc.call(names.rollouter_commands, "set_active_replicas", value=len(members))
        elif isinstance(command, cc.AbortReplicas | cc.SleepReplicas | cc.WakeReplicas | cc.ResumeReplicas):
            action = {cc.AbortReplicas: "abort", cc.SleepReplicas: "sleep", cc.WakeReplicas: "wake",
                      cc.ResumeReplicas: "resume"}[type(command)]
            if isinstance(command, cc.WakeReplicas) and self.release_trainer is not None:
                release, self.release_trainer = self.release_trainer, None
                started = time.monotonic()
                await release()  # after the standalone sync, so a push there reads GPU-resident weights
                report.trainer_release_s += time.monotonic() - started
            await self._workers(command.replica_ids, action)
        elif isinstance(command, cc.SyncWeights):
            await self.sync_weights(command.replica_ids, command.version, report)
        elif isinstance(command, cc.Rebalance):
            await self.rebalance()
        elif isinstance(command, cc.ResetStaleness):
            ack = await self.rpc.call(names.rollouter_commands, "reset_staleness", version=command.version)
            report.rollouter_report = dict(ack.data)
        else:
            raise AssertionError(f"unhandled command {command!r}")

    async def sync_weights(self, replica_ids: tuple[str, ...], version: int, report: ExecutionReport) -> None:
        """Push when these replicas have a push transport and all are alive; otherwise, or when
        the push fails, every replica reloads `version` from the filesystem."""
        transports = {self.transports.get(r, "") for r in replica_ids}
        transport = transports.pop() if len(transports) == 1 else ""
        if transport and self.push is not None and replica_ids and all(await self._alive(replica_ids)):
            fallback: list[str] = []
            for group in push_groups(transport, replica_ids):  # ipc: per replica, each fails alone
                report.pushes += 1
                if not await self.push(group, version, transport):
                    report.push_fallbacks += 1
                    fallback.extend(group)
                    log.warning("%s push of v%d to %s failed: falling back to the filesystem", transport,
                                version, list(group))
            replica_ids = tuple(fallback)
            if not replica_ids:
                return
        await self._workers(replica_ids, "update_weights", version=version, weights_path=self.weights_path)

    async def _alive(self, replica_ids: tuple[str, ...]) -> list[bool]:
        """Which of `replica_ids` have a worker heartbeat, in order (one round trip)."""
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            for replica_id in replica_ids:
                pipe.exists(self.bus.names.worker_heartbeat(replica_id))
            return [bool(n) for n in await pipe.execute()]

    async def _workers(self, replica_ids: tuple[str, ...], action: str, **fields: object) -> None:
        """Send to every replica; wait for the acks of live ones only. A replica whose heartbeat
        expired gets the command too (replayed when it restarts) but is not waited for."""
        names = self.bus.names
        alive = await self._alive(replica_ids)
        for replica_id, is_alive in zip(replica_ids, alive, strict=True):
            if not is_alive:
                log.warning("replica %s has no heartbeat: %s sent, not awaited", replica_id, action)
                await self.rpc.send(names.worker_commands(replica_id), action, **fields)
        live = [names.worker_commands(r) for r, is_alive in zip(replica_ids, alive, strict=True) if is_alive]
        await self.rpc.call_many(live, action, **fields)

    async def wait_for_samples(self, min_queue_size: int) -> None:
        """Poll mq_size until it reaches the threshold. Also ends when the rollouter cannot produce
        more (paused by staleness with nothing in flight, or its feed is exhausted), or on an admin
        force-deactivate, so the wait can never stall training (the original has no such exit)."""
        names = self.bus.names
        while True:
            if await group_lag(self.bus.redis, names.mq, TRAINER_GROUP) >= min_queue_size:
                return
            state = {text(k): text(v) for k, v in (await self.bus.redis.hgetall(names.rollouter_state)).items()}
            blocked = state.get("paused") == "1" and state.get("active_tasks") == "0"
            exhausted = state.get("feed_done") == "1" and state.get("active_tasks") == "0"
            if blocked or exhausted or self.force_event.is_set():
                log.info("wait for %d samples ended early (blocked=%s exhausted=%s forced=%s)",
                         min_queue_size, blocked, exhausted, self.force_event.is_set())
                self.force_event.clear()
                return
            await asyncio.sleep(POLL_S)

    async def rebalance(self) -> None:
        """Clear sticky sessions, abort every serving replica, resume them all, so the retried
        requests spread least-loaded onto the newly added (empty) hybrids.

        No drain poll between abort and resume (the original polls in-flight == 0 for up to
        30 s to cover its fire-and-forget release; retries re-acquiring meanwhile can make that
        poll spin to the timeout, reference 2.4). Here results pass through the load balancer,
        which releases the slot before the rollouter can see the result and retry, so its
        counts are exact when the retries arrive."""
        names = self.bus.names
        serving = self.standalone_ids + self.serving_hybrids
        await self.rpc.call(names.lb_commands, "clear_sticky")
        await self._workers(serving, "abort")
        await self._workers(serving, "resume")
