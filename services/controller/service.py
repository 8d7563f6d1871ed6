"""The controller service: drives the sync-cycle protocol around the pure controller core.

Where it sits: it reads the trainer's step-phase events, asks
`core.controller.ControllerCore` (policy inside) what to do, has the
`Executor` do it over the bus, replies to the trainer, and emits one
`CycleMetrics` entry per sync cycle. Its admin API (admin.py) reads and
steers the same object.

Crash safety: after every decision the core's snapshot and the event being
handled are written to Redis *before* the commands run, and the trainer's
event is acked only after its reply is sent. A restarted controller restores
the core; the unacked event is replayed; if it was half-done, the core's
`recovery_commands` (idempotent) are executed again and the event finished;
if it was done, only the reply is sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack

from core.controller import ControllerCore, Mode
from core.metrics import CycleAggregator
from policies import DynamicScheduleContext, build_policy, load_policy_module
from services.controller.executor import ExecutionReport, Executor
from shared.bus import Bus, Subscription, text
from shared.config import Config
from shared.names import CONTROLLER_GROUP
from shared.rpc import CommandClient
from shared.schema import CycleMetrics, Message, TrainerEvent, TrainerReply

log = logging.getLogger(__name__)
CONSUMER = "controller"


def build_core(config: Config) -> ControllerCore:
    """Without dynamic scheduling there are no hybrids and the run is plain fully-async, which is
    exactly what static_fully_async does (so no switches are counted and no ratio adapts)."""
    at = config.async_training
    if at.dynamic_schedule_policy_module:
        load_policy_module(at.dynamic_schedule_policy_module)
    name = at.dynamic_schedule_policy if at.use_dynamic_resource_scheduling else "static_fully_async"
    policy = build_policy(name, deactivate_ratio=at.dynamic_schedule_deactivate_ratio, only_hybrid=config.only_hybrid)
    ctx = DynamicScheduleContext(
        required_samples=config.trainer.ppo_mini_batch_size * at.require_batches,
        trigger_parameter_sync_step=at.trigger_parameter_sync_step,
        only_hybrid=config.only_hybrid, staleness_threshold=at.staleness_threshold)
    return ControllerCore(policy=policy, ctx=ctx, hybrid_ids=config.hybrid_ids,
                          standalone_ids=config.standalone_ids, enable_rebalance=at.dynamic_schedule_enable_rebalance)


class Controller:
    def __init__(self, *, bus: Bus, config: Config) -> None:
        self.bus = bus
        self.config = config
        self.core = build_core(config)
        self.rpc = CommandClient(bus)
        self.force_deactivate_now = asyncio.Event()
        transports = {r: config.weight_transport(r) for r in config.standalone_ids + config.hybrid_ids}
        self.executor = Executor(bus=bus, rpc=self.rpc, standalone_ids=config.standalone_ids,
                                 force_event=self.force_deactivate_now,
                                 transports={r: t for r, t in transports.items() if t != "filesystem"})
        self.aggregator = CycleAggregator()
        self.last_event: dict[str, Any] = {}
        self.cycle_report: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self._deferred: list[tuple[str, Message]] = []
        """Trainer events read (not acked) while a handler waited for another one."""
        self.on_metrics: list[Any] = []
        """Callbacks taking one cycle's metrics dict (the Prometheus exporter registers here)."""

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """1. restore the core; 2. handle trainer events one at a time until `stop` or the run is done."""
        await self._restore()
        await self.rpc.start()
        await self._announce_capacity()
        events = await self.bus.subscribe(self.bus.names.trainer_events, CONTROLLER_GROUP, CONSUMER)
        try:
            while not stop.is_set():
                for entry_id, message in await self._next_events(events):
                    if isinstance(message, TrainerEvent) and not await self._handle_unless_stopped(
                            message, events, stop):
                        return  # stopped mid-event: left unacked, replayed by the next controller
                    await events.ack(entry_id)
        finally:
            await events.close()
            await self.rpc.close()

    async def _handle_unless_stopped(self, event: TrainerEvent, events: Subscription,
                                     stop: asyncio.Event) -> bool:
        """Handle one event; a stop request (SIGTERM) interrupts it like a crash would, so a
        controller waiting on an unresponsive peer still exits promptly. False if interrupted."""
        handler = asyncio.create_task(self._handle(event, events))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([handler, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
            return False
        handler.result()
        return True

    async def _restore(self) -> None:
        raw = await self.bus.redis.get(self.bus.names.controller_state)
        if raw is None:
            await self.persist()
            return
        saved = msgpack.unpackb(raw, raw=False)
        self.core = ControllerCore.restore(saved["core"], policy=self.core.policy)
        self.last_event = saved.get("last_event", {})
        self.executor.serving_hybrids = self.core.hybrid_ids if self.core.mode is Mode.HYBRID_ACTIVE else ()
        log.info("restored controller: mode=%s last_event=%s", self.core.mode, self.last_event)

    async def _announce_capacity(self) -> None:
        """Tell the rollouter how many replicas serve right now (standalones, plus hybrids if active)."""
        serving = len(self.core.standalone_ids) + len(self.executor.serving_hybrids)
        await self.rpc.call(self.bus.names.rollouter_commands, "set_active_replicas", value=serving)

    async def persist(self) -> None:
        state = {"core": self.core.snapshot(), "last_event": self.last_event}
        await self.bus.redis.set(self.bus.names.controller_state, msgpack.packb(state, use_bin_type=True))

    # -- events ----------------------------------------------------------------------

    async def _handle(self, event: TrainerEvent, events: Subscription) -> None:
        log.debug("trainer event %s gs=%d v=%d", event.phase, event.global_steps, event.version)
        key = {"phase": event.phase, "global_steps": event.global_steps}
        replay = {k: self.last_event.get(k) for k in key} == key
        if replay and self.last_event.get("status") == "done":
            log.info("re-sending the reply to a replayed %s", key)
            await self._reply_to(event, self.last_event.get("reply", {}))
            return
        if event.phase == "micro_step_start":
            reply = await self._on_micro_step_start(event, recovering=replay)
        elif event.phase == "weights_ready":
            reply = await self._on_weights_ready(event, events, recovering=replay)
        elif event.phase == "collected":
            self.core.record_collection(wait_time_s=float(event.data["wait_time_s"]),
                                        wait_samples=int(event.data["wait_samples"]))
            reply = {}
        elif event.phase == "micro_step_done":
            await self._on_micro_step_done(event)
            reply = {}
        elif event.phase == "done":
            await self._finish_run()
            reply = {}
        else:
            log.warning("ignoring trainer event %s", event.phase)
            return
        self.last_event = {**key, "status": "done", "reply": reply}
        await self.persist()
        await self._reply_to(event, reply)

    async def _reply_to(self, event: TrainerEvent, reply: dict[str, Any]) -> None:
        action = {"micro_step_start": "gpus_ready", "weights_ready": "sync_done"}.get(event.phase)
        if action:
            await self.bus.publish(self.bus.names.trainer_replies,
                                   TrainerReply(action=action, global_steps=event.global_steps, data=reply))

    async def _begin(self, event: TrainerEvent) -> None:
        self.last_event = {"phase": event.phase, "global_steps": event.global_steps, "status": "in_progress"}
        await self.persist()

    async def _on_micro_step_start(self, event: TrainerEvent, *, recovering: bool) -> dict[str, Any]:
        if recovering and self.core.mode is Mode.DEACTIVATING:
            commands = self.core.recovery_commands()
        else:
            commands = self.core.begin_micro_step(event.global_steps)
        await self._begin(event)
        report = await self.executor.execute(commands)
        if self.core.mode is Mode.DEACTIVATING:
            self.core.finish_deactivate(report.switch_s)
            self.executor.serving_hybrids = ()
            await self.bus.audit(kind="switch", subject="controller", detail="deactivated",
                                 version=event.version)
        return {"wait_for_enough_samples_s": report.wait_for_enough_samples_s, "deactivate_s": report.switch_s}

    async def _on_weights_ready(self, event: TrainerEvent, events: Subscription, *,
                                recovering: bool) -> dict[str, Any]:
        if recovering and self.core.in_sync:
            commands = self.core.recovery_commands()
        else:
            state = {text(k): text(v) for k, v in
                     (await self.bus.redis.hgetall(self.bus.names.rollouter_state)).items()}
            commands = self.core.begin_sync(
                global_steps=event.global_steps, version=event.version,
                total_generated_samples=int(state.get("total_generated", 0)),
                completed_steps=int(state.get("completed_steps", 1)))
        await self._begin(event)
        self.executor.weights_path = event.weights_path
        activating = self.core.mode is Mode.ACTIVATING
        if activating and self.core.hybrid_ids:
            self.executor.release_trainer = lambda: self._take_trainer_gpus(event, events)
        self.executor.push = lambda ids, version, transport: self._push(event, events, ids, version, transport)
        try:
            report: ExecutionReport = await self.executor.execute(commands)
        finally:
            self.executor.release_trainer = self.executor.push = None
        if activating:
            self.core.finish_activate(report.switch_s)
            await self.bus.audit(kind="switch", subject="controller", detail="activated", version=event.version)
        self.core.finish_sync(event.global_steps)
        self.cycle_report = {
            **{k: float(v) for k, v in report.rollouter_report.items()},
            "timing_s/activate": report.switch_s if activating else 0.0,
            "timing_s/standalone_sync": report.standalone_sync_s,
            "timing_s/trainer_release": report.trainer_release_s,
            "weights/pushes": float(report.pushes),
            "weights/push_fallbacks": float(report.push_fallbacks),
        }
        return {"activated": activating, "param_sync_s": report.standalone_sync_s + report.switch_s}

    async def _take_trainer_gpus(self, event: TrainerEvent, events: Subscription) -> None:
        """Ask the trainer to offload and wait for its ack, so hybrids wake into free GPU memory."""
        await self.bus.publish(self.bus.names.trainer_replies,
                               TrainerReply(action="release_gpus", global_steps=event.global_steps))
        await self._await_trainer(events, lambda m: m.phase == "gpus_released_ack")

    async def _push(self, event: TrainerEvent, events: Subscription, replica_ids: tuple[str, ...],
                    version: int, transport: str) -> bool:
        """Ask the trainer to push `version` to `replica_ids` and wait for its report."""
        await self.bus.publish(self.bus.names.trainer_replies, TrainerReply(
            action="push_weights", global_steps=event.global_steps,
            data={"replica_ids": list(replica_ids), "version": version, "transport": transport}))
        report = await self._await_trainer(events, lambda m: (
            m.phase == "weights_pushed" and m.data.get("replica_ids") == list(replica_ids) and m.version == version))
        ok = bool(report.data.get("ok"))
        await self.bus.audit(kind="push", subject="controller", version=version, detail=(
            f"{transport} {list(replica_ids)} {'ok' if ok else 'failed: ' + str(report.data.get('error'))}"
            f" {float(report.data.get('push_s', 0.0)):.3f}s"))
        return ok

    async def _await_trainer(self, events: Subscription,
                             matches: Callable[[TrainerEvent], bool]) -> TrainerEvent:
        """Wait, inside an event's handling, for the trainer event that `matches`. Any other trainer
        event (a restarted trainer's next step) is kept, unacked, for the main loop: never dropped."""
        while True:
            for entry_id, message in await events.read(count=1, block_ms=200):
                if isinstance(message, TrainerEvent) and matches(message):
                    await events.ack(entry_id)
                    return message
                if isinstance(message, TrainerEvent):
                    self._deferred.append((entry_id, message))
                else:
                    await events.ack(entry_id)

    async def _next_events(self, events: Subscription) -> list[tuple[str, Message]]:
        """Events kept back during a handler first, in arrival order; then the stream."""
        if self._deferred:
            return [self._deferred.pop(0)]
        return await events.read(count=1, block_ms=200)

    async def _on_micro_step_done(self, event: TrainerEvent) -> None:
        self.aggregator.add(event.data)
        trigger = self.config.async_training.trigger_parameter_sync_step
        if event.global_steps % trigger == 0:
            await self._emit_cycle(event)

    async def _emit_cycle(self, event: TrainerEvent) -> None:
        report = dict(self.cycle_report)
        rollout_utilization = report.pop("dynamic_resource/rollout_resource_utilization", None)
        self.aggregator.add(report)
        metrics = self.aggregator.reduce(
            rollout_utilization=rollout_utilization, num_trainer_gpus=self.config.trainer.num_gpus,
            num_standalone_gpus=self.config.rollout.num_standalone_gpus)
        num_gpus = self.config.trainer.num_gpus + self.config.rollout.num_standalone_gpus
        step_s = metrics.get("timing_s/step", 0.0)
        if step_s > 0:  # the original's perf/throughput: tokens / (step time x all GPUs)
            metrics["perf/throughput"] = metrics.get("perf/total_num_tokens", 0.0) / (step_s * num_gpus)
        metrics.update({"dynamic_resource/activations": float(self.core.activations),
                        "dynamic_resource/deactivations": float(self.core.deactivations),
                        "dynamic_resource/deactivate_ratio": float(getattr(self.core.policy, "deactivate_ratio", 0))})
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
        await self.bus.redis.hset(self.bus.names.run_state, "status", "done")
        await self.bus.audit(kind="phase", subject="controller", detail="run done")

    # -- admin -------------------------------------------------------------------------

    async def force(self, *, activate: bool) -> None:
        """Admin forced switch: applied at the next safe point through the core's normal ordering."""
        self.core.force(activate)
        if not activate and self.core.mode in (Mode.HYBRID_ACTIVE, Mode.DEACTIVATING):
            self.force_deactivate_now.set()  # ends an in-progress wait for samples
        await self.persist()
