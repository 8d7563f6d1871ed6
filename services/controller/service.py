"""The controller service: drives the sync-cycle protocol around the pure controller core.

Where it sits: it reads the trainer's step-phase events and hands each to
`core.executor.ExecutorCore` (around `core.controller.ControllerCore`, policy
inside), whose plan of operations the `Executor` performs over the bus; then it
replies to the trainer, and emits one `CycleMetrics` entry per sync cycle. The
simulator drives the same ExecutorCore on its virtual clock. The trainer's events
are read by this loop only: what the controller needs from the trainer during a
sync (releasing its GPUs, syncing replicas) are commands it acks like any peer.
Its admin API (admin.py) reads and steers the same object.

Crash safety: after every decision the core's snapshot and the event being
handled are written to Redis *before* the commands run, and the trainer's
event is acked only after its reply is sent. A restarted controller restores
the core; the unacked event is replayed; if it was half-done, the core's
`recovery_commands` (idempotent) are executed again and the event finished;
if it was done, only the reply is sent again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, TypeVar

from core import executor as ex
from core import metrics as M
from core.build import build_controller_core, build_executor_core
from core.controller import ControllerCore, Mode
from core.metrics import CycleAggregator
from policies import DynamicSchedulePolicyBase, build_policy, load_policy_module
from services.controller.executor import Executor
from services.controller.snapshot import HandledEvent, dump_snapshot, load_snapshot
from shared.bus import Bus, text
from shared.config import Config
from shared.names import CONTROLLER_GROUP, RunStateField, RunStatus
from shared.peer_liveness import serving
from shared.rpc import CommandClient
from shared.runtime import sleep_unless
from shared.schema import (
    AuditEvent,
    AuditKind,
    AuditPhase,
    CommandAction,
    CycleMetrics,
    TrainerEvent,
    TrainerPhase,
    TrainerReply,
)

log = logging.getLogger(__name__)
CONSUMER = "controller"
START_POLL_S = 0.02
"""Period of the start-up wait for workers (one Redis round trip)."""
T = TypeVar("T")


def build_core(config: Config) -> ControllerCore:
    """Without dynamic scheduling there are no hybrids and the run is plain fully-async, which is
    exactly what static_fully_async does (so no switches are counted and no ratio adapts)."""
    at = config.async_training
    if at.dynamic_schedule_policy_module:
        load_policy_module(at.dynamic_schedule_policy_module)
    return build_controller_core(at, required_samples=config.trainer.ppo_mini_batch_size * at.require_batches,
                                 responses_per_sample=config.data.n,
                                 max_running_requests_per_replica=config.rollout.max_num_seqs,
                                 hybrid_ids=config.hybrid_ids, standalone_ids=config.standalone_ids,
                                 total_samples=config.data.total_rollout_steps)


def executor_core(core: ControllerCore, config: Config) -> ex.ExecutorCore:
    """The command semantics around `core`, with the config's switch overlaps, on the wall clock."""
    return build_executor_core(config.async_training, core=core, clock=time.monotonic)


class Controller:
    def __init__(self, *, bus: Bus, config: Config) -> None:
        self.bus = bus
        self.config = config
        self.executor_core = executor_core(build_core(config), config)
        self.rpc = CommandClient(bus)
        self.force_deactivate_now = asyncio.Event()
        self.executor = Executor(bus=bus, rpc=self.rpc, force_event=self.force_deactivate_now)
        self.aggregator = CycleAggregator()
        self.last_event: HandledEvent | None = None
        self.cycle_report: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.on_metrics: list[Any] = []
        """Callbacks taking one cycle's metrics dict (the Prometheus exporter registers here)."""
        self.ready = False
        """Set once the core is restored (or created) and saved: the admin API's /readyz."""

    @property
    def core(self) -> ControllerCore:
        """The hybrid lifecycle state machine (with the policy) this controller drives."""
        return self.executor_core.core

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """1. restore the core; 2. in a fresh run, wait for the workers to start; 3. handle trainer
        events one at a time until `stop` or the run is done."""
        fresh = await self._restore()
        self.ready = True
        await self.rpc.start()
        await self.executor.start()
        if fresh:
            await self._await_started_workers(stop)
        await self._announce_capacity()
        events = await self.bus.subscribe(self.bus.names.trainer_events, CONTROLLER_GROUP, CONSUMER)
        try:
            while not stop.is_set():
                for entry_id, message in await events.read(count=1, block_ms=200):
                    if isinstance(message, TrainerEvent) and not await self._handle_unless_stopped(
                            message, stop):
                        return  # stopped mid-event: left unacked, replayed by the next controller
                    await events.ack(entry_id)
        finally:
            await events.close()
            await self.executor.close()
            await self.rpc.close()

    async def _handle_unless_stopped(self, event: TrainerEvent, stop: asyncio.Event) -> bool:
        """Handle one event; a stop request (SIGTERM) interrupts it like a crash would, so a
        controller waiting on an unresponsive peer still exits promptly. False if interrupted."""
        handler = asyncio.create_task(self._handle(event))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([handler, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
            return False
        handler.result()
        return True

    async def _restore(self) -> bool:
        """The core from its snapshot, if one was saved; True if there was none (a fresh run)."""
        raw = await self.bus.redis.get(self.bus.names.controller_state)
        if raw is None:
            await self.persist()
            return True
        core_state, self.last_event = load_snapshot(raw, key=self.bus.names.controller_state)
        core = ControllerCore.restore(core_state, policy=await self._chosen_policy())
        self.executor_core = executor_core(core, self.config)
        log.info("restored controller: mode=%s last_event=%s", core.mode, self.last_event)
        return False

    async def _await_started_workers(self, stop: asyncio.Event) -> None:
        """Before the first event of a fresh run: wait, within `worker_start_timeout_s`, until every
        replica's worker has started (`worker_serving`). Otherwise the startup sync's first wake
        would wait for hybrids still loading their engines, and the policy would price that start
        as the cost of a switch. A restored controller does not wait: its workers have started."""
        names, core = self.bus.names, self.core
        replica_ids = list(core.standalone_ids) + list(core.hybrid_ids)
        deadline = time.monotonic() + self.config.rollout.worker_start_timeout_s
        while not stop.is_set():
            started = await serving(self.bus.redis, names, replica_ids)
            waiting = [r for r, up in zip(replica_ids, started, strict=True) if not up]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                log.warning("replicas %s have not started after %.0f s: handling the trainer's events "
                            "without them", waiting, self.config.rollout.worker_start_timeout_s)
                return
            await sleep_unless(stop, START_POLL_S)

    async def _chosen_policy(self) -> DynamicSchedulePolicyBase:
        """The config's policy, unless the admin API chose another (Names.controller_policy)."""
        policy = self.core.policy
        chosen = await self.bus.redis.get(self.bus.names.controller_policy)
        if chosen is None or text(chosen) == policy.policy_name:
            return policy
        try:
            ratio = float(getattr(policy, "deactivate_ratio", 0.3))
            return build_policy(text(chosen), deactivate_ratio=ratio, only_hybrid=self.config.only_hybrid)
        except ValueError as exc:  # its module is no longer configured: say so, keep the config's
            log.error("policy %r chosen through the admin API cannot be built (%s); using %r",
                      text(chosen), exc, policy.policy_name)
            return policy

    async def _announce_capacity(self) -> None:
        """Tell the rollouter how many replicas serve right now (standalones, plus hybrids if active)."""
        serving = len(self.core.standalone_ids) + len(self.executor_core.serving_hybrids)
        await self.rpc.call(self.bus.names.rollouter_commands, CommandAction.SET_ACTIVE_REPLICAS,
                            value=serving)

    async def persist(self, *, handled: TrainerEvent | None = None) -> None:
        """Save the snapshot; with `handled`, in the same transaction, mark that event's id handled
        (a late copy of it, once another event has been handled, is then ignored)."""
        snapshot = dump_snapshot(self.core.snapshot(), self.last_event)
        if handled is None or not handled.event_id:
            await self.bus.redis.set(self.bus.names.controller_state, snapshot)
            return
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.bus.names.controller_state, snapshot)
            pipe.set(self._handled_key(handled), 1, ex=self.bus.handled_ttl_s)
            await pipe.execute()

    # -- events ----------------------------------------------------------------------

    async def _handle(self, event: TrainerEvent) -> None:
        log.debug("trainer event %s gs=%d v=%d", event.phase, event.global_steps, event.version)
        last = self.last_event
        replay = last is not None and last.matches(event)
        if last is not None and replay and last.finished:
            log.info("re-sending the reply to a replayed %s %d", event.phase, event.global_steps)
            await self._reply(last.saved_reply())
            return
        if not replay and event.event_id and await self.bus.redis.exists(self._handled_key(event)):
            log.warning("ignoring a late copy of trainer event %s %d (%s), handled before %s %d",
                        event.phase, event.global_steps, event.event_id, last and last.phase,
                        last and last.global_steps)
            return
        reply: TrainerReply | None = None
        logic = self.executor_core
        if event.phase is TrainerPhase.MICRO_STEP_START:
            reply = await self._drive(logic.on_micro_step_start(event, recovering=replay), event)
        elif event.phase is TrainerPhase.WEIGHTS_READY:
            reply = await self._drive(logic.on_weights_ready(event, recovering=replay), event)
            self.cycle_report = logic.last_report.cycle_metrics()
        elif event.phase is TrainerPhase.COLLECTED:
            logic.on_collected(event)
        elif event.phase is TrainerPhase.MICRO_STEP_DONE:
            await self._on_micro_step_done(event)
        elif event.phase is TrainerPhase.DONE:
            await self._finish_run()
        self.last_event = HandledEvent(phase=event.phase, global_steps=event.global_steps, finished=True,
                                       reply=dataclasses.asdict(reply) if reply else {})
        await self.persist(handled=event)
        await self._reply(reply)

    def _handled_key(self, event: TrainerEvent) -> str:
        return self.bus.names.handled(CONSUMER, event.event_id)

    async def _drive(self, plan: ex.Plan[T], event: TrainerEvent) -> T:
        """Perform the plan's operations in order; at its Checkpoint, persist the event in progress
        (so a restarted controller re-runs the core's recovery commands)."""
        result: Any = None
        while True:
            try:
                op = plan.send(result)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(op, ex.Checkpoint):
                self.last_event = HandledEvent(phase=event.phase, global_steps=event.global_steps)
                await self.persist()
                result = None
            else:
                result = await self.executor.perform(op)

    async def _reply(self, reply: TrainerReply | None) -> None:
        if reply is not None:
            await self.bus.publish(self.bus.names.trainer_replies, reply)

    async def _on_micro_step_done(self, event: TrainerEvent) -> None:
        self.aggregator.add(event.stats)
        trigger = self.config.async_training.trigger_parameter_sync_step
        if event.global_steps % trigger == 0:
            await self._emit_cycle(event)

    async def _emit_cycle(self, event: TrainerEvent) -> None:
        report = dict(self.cycle_report)
        rollout_utilization = report.pop(M.ROLLOUT_UTIL, None)
        self.aggregator.add(report)
        metrics = self.aggregator.reduce(
            rollout_utilization=rollout_utilization, num_trainer_gpus=self.config.trainer.num_gpus,
            num_standalone_gpus=self.config.rollout.num_standalone_gpus)
        num_gpus = self.config.trainer.num_gpus + self.config.rollout.num_standalone_gpus
        step_s = metrics.get(M.STEP_TIME, 0.0)
        if step_s > 0:  # the original's perf/throughput: tokens / (step time x all GPUs)
            metrics["perf/throughput"] = metrics.get("perf/total_num_tokens", 0.0) / (step_s * num_gpus)
        metrics.update({"dynamic_resource/activations": float(self.core.activations),
                        "dynamic_resource/deactivations": float(self.core.deactivations),
                        "dynamic_resource/deactivate_ratio": float(
                            getattr(self.core.policy, "deactivate_ratio", 0))})
        self.aggregator.reset()
        self.cycle_report = {}
        self.last_metrics = metrics
        await self.bus.publish(self.bus.names.metrics, CycleMetrics(
            version=event.version, global_steps=event.global_steps, t=time.time(), metrics=metrics))
        for callback in self.on_metrics:
            callback(metrics)

    async def _finish_run(self) -> None:
        if len(self.aggregator):
            log.info("dropping metrics of an incomplete final cycle")
        await self.bus.redis.hset(self.bus.names.run_state, RunStateField.STATUS, RunStatus.DONE)
        await self.bus.record(AuditEvent(kind=AuditKind.PHASE, subject=CONSUMER, t=time.time(),
                                         phase=AuditPhase.RUN_DONE, detail="run done"))

    # -- admin -------------------------------------------------------------------------

    async def force(self, *, activate: bool) -> None:
        """Admin forced switch: applied at the next safe point through the core's normal ordering."""
        self.core.force(activate)
        if not activate and self.core.mode in (Mode.HYBRID_ACTIVE, Mode.DEACTIVATING):
            self.force_deactivate_now.set()  # ends an in-progress wait for samples
        await self.persist()
