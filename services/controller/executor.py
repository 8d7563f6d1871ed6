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
from dataclasses import dataclass, field
from typing import Any

from core import controller as cc
from services.controller.rpc import CommandClient
from shared.bus import Bus, text
from shared.names import TRAINER_GROUP
from shared.streams import group_lag

log = logging.getLogger(__name__)
POLL_S = 0.05


@dataclass
class ExecutionReport:
    """What executing one command list measured."""

    wait_for_enough_samples_s: float = 0.0
    switch_s: float = 0.0
    """Time in lifecycle commands (remove/abort/sleep or wake/sync-hybrids/add/resume/rebalance)."""
    standalone_sync_s: float = 0.0
    rollouter_report: dict[str, Any] = field(default_factory=dict)


class Executor:
    def __init__(self, *, bus: Bus, rpc: CommandClient, standalone_ids: tuple[str, ...],
                 weights_path: str = "", force_event: asyncio.Event | None = None) -> None:
        self.bus = bus
        self.rpc = rpc
        self.standalone_ids = standalone_ids
        self.weights_path = weights_path
        self.serving_hybrids: tuple[str, ...] = ()
        self.force_event = force_event or asyncio.Event()

    async def execute(self, commands: list[cc.Command]) -> ExecutionReport:
        report = ExecutionReport()
        for command in commands:
            started = time.monotonic()
            await self._run(command, report)
            elapsed = time.monotonic() - started
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
            await self._workers(command.replica_ids, action)
        elif isinstance(command, cc.SyncWeights):
            await self._workers(command.replica_ids, "update_weights", version=command.version,
                                weights_path=self.weights_path)
        elif isinstance(command, cc.Rebalance):
            await self.rebalance()
        elif isinstance(command, cc.ResetStaleness):
            ack = await self.rpc.call(names.rollouter_commands, "reset_staleness", version=command.version)
            report.rollouter_report = dict(ack.data)
        else:
            raise AssertionError(f"unhandled command {command!r}")

    async def _workers(self, replica_ids: tuple[str, ...], action: str, **fields: object) -> None:
        """Send to every replica; wait for the acks of live ones only. A replica whose heartbeat
        expired gets the command too (replayed when it restarts) but is not waited for."""
        names = self.bus.names
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            for replica_id in replica_ids:
                pipe.exists(names.heartbeat(f"worker:{replica_id}"))
            alive = await pipe.execute()
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
