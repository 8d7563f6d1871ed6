"""Performs the command semantics' operations against the live services, over the bus.

Where it sits: `core.controller.ControllerCore` decides *what* happens and in which
order; `core.executor.ExecutorCore` says what each command means as a sequence of
operations; this module performs one operation at a time over Redis: load-balancer
membership, worker lifecycle commands, the trainer's GPU release and weight sync, the
rollouter's replica count and staleness reset, and the wait for enough samples. Every
operation is idempotent, so a plan can be re-run after a controller crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from core import executor as ex
from core.sample_lifecycle import RolloutStatus
from shared.bus import Bus, text
from shared.liveness import beat
from shared.names import TRAINER_GROUP
from shared.names import RolloutStateField as F
from shared.peer_liveness import alive
from shared.rpc import CommandClient
from shared.schema import CommandAction
from shared.streams import group_lag

log = logging.getLogger(__name__)
CONSUMER = "controller"
"""The subject of the controller's audit events."""
POLL_S = 0.01
"""Period of the wait for samples (two Redis reads): the wait ends at most this late, which at
run.time_scale 0.05 is 0.2 modelled s (0.05 made every deactivation ~0.5 modelled s late on average)."""
TRAINER_CALL_TIMEOUT_S = 3600.0
"""A weight sync may take minutes (a push of a large model). Sent once, never re-sent: a trainer
that restarts replays the pending command from its consumer group, and a second push of the same
version while the first still runs would wait for a broadcast that never comes."""
WORKER_DEADLINE_S = 180.0
"""How long a live worker may take to ack one lifecycle command (a vLLM wake or sleep of a large
model takes tens of seconds); past it the worker is marked unresponsive and the plan goes on."""


_TRAINER_GPU_ACTIONS = {ex.ReleaseTrainer: CommandAction.RELEASE_GPUS,
                        ex.AcquireTrainer: CommandAction.ACQUIRE_GPUS}
"""The trainer command each of the executor's trainer-GPU ops is."""


class Executor:
    def __init__(self, *, bus: Bus, rpc: CommandClient, force_event: asyncio.Event | None = None,
                 worker_deadline_s: float = WORKER_DEADLINE_S) -> None:
        self.bus = bus
        self.rpc = rpc
        self.worker_deadline_s = worker_deadline_s
        self.trainer_rpc = CommandClient(bus, timeout_s=TRAINER_CALL_TIMEOUT_S, max_attempts=1)
        self.force_event = force_event or asyncio.Event()

    async def start(self) -> None:
        await self.trainer_rpc.start()

    async def close(self) -> None:
        await self.trainer_rpc.close()

    async def perform(self, op: ex.Op) -> Any:
        """Do one operation; returns what its docstring in core.executor says."""
        names = self.bus.names
        if isinstance(op, ex.AwaitSamples):
            await self.wait_for_samples(op.min_queue_size)
        elif isinstance(op, ex.SetMembers):
            action = CommandAction.ADD if op.add else CommandAction.REMOVE
            ack = await self.rpc.call(names.lb_commands, action, replica_ids=list(op.replica_ids))
            assert ack.routing is not None, f"{ack.sender} acked {action} with no routing report"
            return tuple(ack.routing.members)
        elif isinstance(op, ex.SetActiveReplicas):
            await self.rpc.call(names.rollouter_commands, CommandAction.SET_ACTIVE_REPLICAS,
                                value=op.num_replicas)
        elif isinstance(op, ex.WorkerCall):
            await self._workers(op.replica_ids, op.action)
        elif isinstance(op, ex.ReleaseTrainer | ex.AcquireTrainer):
            await self.trainer_rpc.call(names.trainer_commands, _TRAINER_GPU_ACTIONS[type(op)])
        elif isinstance(op, ex.SyncReplicas):
            ack = await self.trainer_rpc.call(names.trainer_commands, CommandAction.SYNC_WEIGHTS,
                                              replica_ids=list(op.replica_ids), version=op.version,
                                              weights_path=op.weights_path)
            assert ack.weights is not None, f"{ack.sender} acked a weight sync with no report"
            return ack.weights
        elif isinstance(op, ex.ClearSticky):
            await self.rpc.call(names.lb_commands, CommandAction.CLEAR_STICKY)
        elif isinstance(op, ex.ResetRollouter):
            ack = await self.rpc.call(names.rollouter_commands, CommandAction.RESET_STALENESS,
                                      version=op.version)
            assert ack.rollout is not None, f"{ack.sender} acked a staleness reset with no report"
            return dict(ack.rollout.metrics)
        elif isinstance(op, ex.ReadProgress):
            state = await self._rollouter_state()
            queue_size = await group_lag(self.bus.redis, names.mq, TRAINER_GROUP)
            status = RolloutStatus.from_hash(state)
            return ex.RolloutProgress(total_generated=int(state.get(F.TOTAL_GENERATED, 0)),
                                      completed_steps=int(state.get(F.COMPLETED_STEPS, 1)),
                                      cut_samples=int(state.get(F.CUT_SAMPLES, 0)),
                                      queue_size=queue_size, feed_done=status.feed_done,
                                      generating=status.active_tasks,
                                      idle_s=status.idle_seconds(time.time()), handed_over=status.handed_over,
                                      handed_over_on_time=status.handed_over_on_time)
        elif isinstance(op, ex.Concurrently):
            return tuple(await asyncio.gather(*(self.perform(sub) for sub in op.ops)))
        elif isinstance(op, ex.Audit):
            await self.bus.record(op.event.to_event(subject=CONSUMER, t=time.time()))
        else:  # Checkpoint is the controller's own (it persists the event in progress)
            raise AssertionError(f"unhandled op {op!r}")
        return None

    async def _workers(self, replica_ids: tuple[str, ...], action: CommandAction) -> None:
        """Send to every replica; wait for the acks of live ones only, each within the worker
        deadline. A replica that is gone (heartbeat expired, or unresponsive), before or while its
        ack is awaited, gets the command too (replayed when it restarts) but is not waited for: a
        worker that dies or hangs never fails the controller."""
        names = self.bus.names
        is_alive = await alive(self.bus.redis, names, [names.worker_heartbeat(r) for r in replica_ids])
        for replica_id, up in zip(replica_ids, is_alive, strict=True):
            if not up:
                log.warning("replica %s is gone: %s sent, not awaited", replica_id, action)
                await self.rpc.send(names.worker_commands(replica_id), action)
        live = [(names.worker_commands(r), names.worker_heartbeat(r))
                for r, up in zip(replica_ids, is_alive, strict=True) if up]
        await self.rpc.call_peers(live, action, deadline_s=self.worker_deadline_s)

    async def _rollouter_state(self) -> dict[str, str]:
        state = await self.bus.redis.hgetall(self.bus.names.rollouter_state)
        return {text(k): text(v) for k, v in state.items()}

    async def wait_for_samples(self, min_queue_size: int) -> None:
        """Poll mq_size until it reaches the threshold. Also ends when the rollouter cannot produce
        more (`RolloutStatus.stalled`), or on an admin force-deactivate, so the wait can never stall
        training (the original has no such exit)."""
        names = self.bus.names
        while True:
            if await group_lag(self.bus.redis, names.mq, TRAINER_GROUP) >= min_queue_size:
                return
            status = RolloutStatus.from_hash(await self._rollouter_state())
            if status.stalled or self.force_event.is_set():
                log.info("wait for %d samples ended early (%s, forced=%s)", min_queue_size, status,
                         self.force_event.is_set())
                self.force_event.clear()
                return
            beat()
            await asyncio.sleep(POLL_S)
