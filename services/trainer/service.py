"""The trainer service: drives `core.trainer_cycle.TrainerCycle` over Redis with a backend.

Where it sits: the cycle decides the order (handshake, collect, train, ack, sync,
report); this driver performs each step: it reads `required_samples` per micro-step
from the MessageQueue through the trainer consumer group, trains on the backend, and
talks to the controller over the step-phase handshake so it never computes while
hybrids hold its GPUs:

    micro_step_start -> (controller may deactivate hybrids) -> gpus_ready
    collected, train, ack samples
    every trigger_parameter_sync_step micro-steps:
        weights_ready(v+1) -> (controller syncs) -> sync_done
    micro_step_done (the step's metrics)

During a handshake the controller sends it commands on `trainer_commands`, served
concurrently and acked like any peer's: RELEASE_GPUS (offload before the hybrids
wake), ACQUIRE_GPUS (onload while they sleep, under dynamic_schedule_overlap_sleep),
and SYNC_WEIGHTS (bring replicas to the version: push over their transport, in
its groups, else or for a group whose push failed the filesystem; one WeightSyncReport
back, with each push's outcome). So the weight push is one command the trainer owns
end to end.

Clean stop: the current step finishes its handshake or is abandoned; unacked
samples stay pending. Crash: samples taken but not trained are replayed from
the consumer group on restart; global_steps and the version are read back
from Redis, so training continues where it stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

from core import trainer_cycle as tc
from core.flow import FlowLimits
from core.metrics import stale_trajectory_count, trained_batch_metrics
from services.trainer import vanished
from services.trainer.exactly_once import mark_trained, screen
from services.trainer.weight_push import StreamSyncClient
from shared.bus import Bus, Subscription, malformed_reason, text
from shared.config import Config
from shared.names import TRAINER_GROUP
from shared.names import TrainerStateField as F
from shared.peer_liveness import serving
from shared.rpc import CommandClient, CommandFailed
from shared.runtime import in_thread, supervise
from shared.schema import (
    AuditEvent,
    AuditKind,
    AuditPhase,
    Command,
    CommandAction,
    PushGroupReport,
    Sample,
    TrainerPhase,
    TrainerReply,
    WeightSyncReport,
    decode,
)
from shared.streams import StreamConsumer, group_lag
from shared.weight_transfer import push_plan

log = logging.getLogger(__name__)
CONSUMER = "trainer"
PUSH_CALL_TIMEOUT_S = 300.0


class TrainerBackend(Protocol):
    def assemble_batch(self, samples: list[Any]) -> None:
        """A micro-step's batch is collected: prepare it (inside timing_s/gen)."""

    def train_micro_step(self, samples: list[Any]) -> dict[str, float]: ...

    def validate(self, *, global_steps: int, version: int) -> None:
        """After micro-step `global_steps` reported (0: before training), outside timing_s/step, as
        verl's _fit_validate; the backend decides whether this step validates."""

    def export_weights(self, version: int) -> str | None: ...

    def release_gpu(self) -> None: ...

    def acquire_gpu(self) -> None: ...

    def save_checkpoint(self, version: int, global_steps: int = 0) -> str | None:
        """Save model + optimizer; the pointer to restore them from (None: nothing to save)."""

    def resume_from(self, pointer: str) -> int | None:
        """Restore the checkpoint `pointer` names; its version (None: not found)."""

    def resume_latest(self) -> int | None: ...

    def push_weights(self, transport: str, client: Any) -> None:
        """Push the current weights to the replicas behind `client` (a StreamSyncClient)."""


async def claim_run_id(bus: Bus) -> str:
    """This run's id (kept in trainer_state), so a restarted trainer finds its own weights and
    checkpoints, and a new run never reads an earlier run's files under the same work_dir."""
    key = bus.names.trainer_state
    await bus.redis.hsetnx(key, F.RUN_ID, time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    return text(await bus.redis.hget(key, F.RUN_ID))


class StopRequested(Exception):
    """A signal asked the trainer to stop."""


Batch = list[tuple[bytes, Sample]]
"""A micro-step's samples with their MessageQueue entry ids."""


class Trainer:
    def __init__(self, *, bus: Bus, config: Config, backend: TrainerBackend) -> None:
        self.bus = bus
        self.config = config
        self.backend = backend
        self.limits = FlowLimits.from_config(config)
        self.cycle = tc.TrainerCycle(limits=self.limits, clock=time.monotonic)
        self.stale_trajectories = 0
        self.transports = {r: t for r in config.standalone_ids + config.hybrid_ids
                           if (t := config.weight_transport(r)) != "filesystem"}
        """replica id -> its push transport; absent: filesystem only."""
        self.roles = (set(config.standalone_ids), set(config.hybrid_ids))
        """The replicas pushed apart (`push_plan`): standalones, hybrids."""
        self._rpc = CommandClient(bus)
        self._push_rpc = CommandClient(bus, timeout_s=PUSH_CALL_TIMEOUT_S, max_attempts=1)

    async def run(self, stop: asyncio.Event) -> None:
        """1. restore progress; 2. serve the controller's sync commands while 3. the cycle runs
        (initial sync at v0, micro-steps until the configured total, done); 4. idle until stopped."""
        names = self.bus.names
        state = {text(k): text(v) for k, v in (await self.bus.redis.hgetall(names.trainer_state)).items()}
        self.cycle = tc.TrainerCycle(limits=self.limits, clock=time.monotonic,
                                     global_steps=int(state.get(F.GLOBAL_STEPS, 1)),
                                     version=int(state.get(F.VERSION, 0)),
                                     initial_sync_done=state.get(F.INITIAL_SYNC_DONE) == "1",
                                     sync_pending=state.get(F.SYNC_PENDING) == "1",
                                     checkpoint=state.get(F.CHECKPOINT, ""))
        self.stale_trajectories = int(state.get(F.STALE_TRAJECTORIES, 0))
        await self._restore_weights()
        replies = await self.bus.subscribe(names.trainer_replies, TRAINER_GROUP, CONSUMER)
        commands = await self.bus.subscribe(names.trainer_commands, TRAINER_GROUP, CONSUMER)
        mq = self.bus.consumer(names.mq, TRAINER_GROUP, CONSUMER)
        await mq.start()
        await self._rpc.start()
        await self._push_rpc.start()
        try:
            await supervise({"trainer.cycle": self._run_cycle(replies, mq, stop),
                             "trainer.commands": self.bus.serve_commands(commands, stop, sender=CONSUMER,
                                                                         apply=self._apply)})
        finally:
            for closing in (replies, commands):
                await closing.close()
            await mq.aclose()
            await self._rpc.close()
            await self._push_rpc.close()

    async def _restore_weights(self) -> None:
        """The weights of the committed progress: the checkpoint its pointer names, never a newer one
        saved before a commit that did not happen; without a pointer, the newest checkpoint."""
        if self.cycle.checkpoint:
            resumed = await in_thread(self.backend.resume_from, self.cycle.checkpoint)
        elif self.cycle.version > 0:
            resumed = await in_thread(self.backend.resume_latest)
        else:
            return
        if resumed != self.cycle.version:
            log.warning("trainer state says version %d but the checkpoint restored (%r) holds %s",
                        self.cycle.version, self.cycle.checkpoint, resumed)

    async def _run_cycle(self, replies: Subscription, mq: StreamConsumer, stop: asyncio.Event) -> None:
        plan = self.cycle.run()
        result: Any = None
        await in_thread(partial(self.backend.validate, global_steps=0, version=self.cycle.version))
        try:
            while not stop.is_set():
                try:
                    op = plan.send(result)
                except StopIteration:  # done: the command loop keeps the process up until `stop` (exit 0)
                    return
                result = await self._perform(op, replies, mq, stop)
        except StopRequested:
            log.info("trainer stopping at global_steps=%d", self.cycle.global_steps)

    async def _perform(self, op: tc.TrainerOp, replies: Subscription, mq: StreamConsumer,
                       stop: asyncio.Event) -> Any:
        names = self.bus.names
        if isinstance(op, tc.Handshake | tc.Send):
            await self.bus.publish(names.trainer_events, dataclasses.replace(op.event,
                                                                             event_id=uuid.uuid4().hex))
            if isinstance(op, tc.Handshake):
                return await self._await_reply(replies, stop, op)
            if op.event.phase is TrainerPhase.MICRO_STEP_DONE:
                await in_thread(partial(self.backend.validate, global_steps=op.event.global_steps,
                                        version=op.event.version))
        elif isinstance(op, tc.AcquireGpu):
            await in_thread(self.backend.acquire_gpu)
        elif isinstance(op, tc.QueueSize):
            return await group_lag(self.bus.redis, names.mq, TRAINER_GROUP)
        elif isinstance(op, tc.Collect):
            batch = await self._collect(mq, op.count, stop)
            await in_thread(self.backend.assemble_batch, [sample for _, sample in batch])
            return batch
        elif isinstance(op, tc.Train):
            return await self._train(op.batch)
        elif isinstance(op, tc.MarkTrained):
            await self._mark_trained(mq, op.batch, op.progress)
        elif isinstance(op, tc.SaveCheckpoint):
            return await in_thread(self.backend.save_checkpoint, op.version, op.global_steps)
        elif isinstance(op, tc.ExportWeights):
            path = await in_thread(self.backend.export_weights, op.version) or ""
            # What a (re)starting rollout worker loads before it serves (see RolloutWorker.run).
            await self.bus.redis.hset(names.trainer_state, mapping={F.WEIGHTS_VERSION: op.version,
                                                                    F.WEIGHTS_PATH: path})
            return path
        elif isinstance(op, tc.SaveProgress):
            fields = self._progress_fields(op)
            await self.bus.redis.hset(names.trainer_state, mapping=fields)  # type: ignore[arg-type]
        else:  # pragma: no cover - a new op needs a branch here
            raise AssertionError(f"unhandled trainer op {op!r}")
        return None

    async def _collect(self, mq: StreamConsumer, required: int, stop: asyncio.Event) -> Batch:
        """Pop `required` samples (own pending ones first after a restart); malformed ones, and
        samples not in state queued (duplicates, unknown ids), are dead-lettered and replaced."""
        batch: Batch = []
        taken: set[str] = set()
        waiting_since_s = time.monotonic()
        while len(batch) < required:
            if stop.is_set():
                raise StopRequested
            entries = await mq.read(count=required - len(batch), block_ms=200)
            if entries:
                waiting_since_s = time.monotonic()
            elif time.monotonic() - waiting_since_s >= vanished.CHECK_AFTER_S:  # queued, never delivered?
                await vanished.requeue_vanished(self.bus.redis, self.bus.names,
                                                held=[(entry_id, m.sample_id) for entry_id, m in batch])
                waiting_since_s = time.monotonic()
            decoded = []
            for entry in entries:
                try:
                    message = decode(entry.fields)
                except Exception as exc:  # any failure to decode one entry fails that entry alone
                    await mq.dead_letter(entry, reason=malformed_reason(exc))
                    continue
                if not isinstance(message, Sample):
                    await mq.dead_letter(entry, reason=f"not a sample: {type(message).__name__}")
                else:
                    decoded.append((entry, message))
            reasons = await screen(self.bus.redis, self.bus.names, [m.sample_id for _, m in decoded], taken)
            for (entry, message), reason in zip(decoded, reasons, strict=True):
                if reason:
                    await mq.dead_letter(entry, reason=reason)
                else:
                    batch.append((entry.entry_id, message))
        return batch

    async def _train(self, batch: Sequence[tuple[bytes, Sample]]) -> tc.TrainResult:
        gs, version = self.cycle.global_steps, self.cycle.version
        samples = [sample for _, sample in batch]
        await self._record_phase(AuditPhase.TRAIN_START, gs, version)
        timings = await in_thread(self.backend.train_micro_step, samples)
        await self._record_phase(AuditPhase.TRAIN_END, gs, version)
        return tc.TrainResult(timings=timings, stats=self._sample_metrics(samples))

    async def _record_phase(self, phase: AuditPhase, global_steps: int, version: int) -> None:
        await self.bus.record(AuditEvent(kind=AuditKind.PHASE, subject=CONSUMER, t=time.time(),
                                         phase=phase,
                                         global_steps=global_steps, version=version,
                                         detail=f"{phase} {global_steps}"))

    def _progress_fields(self, progress: tc.SaveProgress) -> dict[str, int | str]:
        return {F.GLOBAL_STEPS: progress.global_steps, F.VERSION: progress.version,
                F.INITIAL_SYNC_DONE: int(progress.initial_sync_done),
                F.SYNC_PENDING: int(progress.sync_pending), F.STALE_TRAJECTORIES: self.stale_trajectories,
                F.CHECKPOINT: progress.checkpoint}

    async def _mark_trained(self, mq: StreamConsumer, batch: Sequence[tuple[bytes, Sample]],
                            progress: tc.SaveProgress) -> None:
        """XACK, move the samples `queued -> trained` by compare-and-set and save the progress, in
        one script: a restart never trains a committed micro-step again."""
        rejected = await mark_trained(self.bus.redis, self.bus.names,
                                      [(entry_id, sample.sample_id) for entry_id, sample in batch],
                                      progress=self._progress_fields(progress),
                                      dead_letter_maxlen=mq.dead_letter_maxlen)
        if rejected:
            log.error("samples no longer queued when marked trained (dead-lettered): %s", rejected)
        await mq.ack(entry_id for entry_id, _ in batch)  # acked by the script; clears the hand-out record

    def _sample_metrics(self, samples: list[Sample]) -> dict[str, float]:
        trajectories = [t for s in samples for t in s.trajectories]
        self.stale_trajectories += stale_trajectory_count(self.cycle.version,
                                                          (t.max_version for t in trajectories))
        return trained_batch_metrics(self.cycle.version, samples, stale_trajectories=self.stale_trajectories)

    async def _await_reply(self, replies: Subscription, stop: asyncio.Event,
                           op: tc.Handshake) -> TrainerReply:
        """Wait for the controller's answer to this handshake (a stale answer to an earlier one is
        skipped)."""
        action = tc.REPLY_TO[op.event.phase]
        while True:
            if stop.is_set():
                raise StopRequested
            for entry_id, message in await replies.read(count=8, block_ms=200):
                await replies.ack(entry_id)
                if (isinstance(message, TrainerReply) and message.action == action
                        and message.global_steps == op.event.global_steps):
                    return message

    # -- commands from the controller during a sync ------------------------------------

    async def _apply(self, command: Command) -> WeightSyncReport | None:
        if command.action is CommandAction.RELEASE_GPUS:
            await in_thread(self.backend.release_gpu)
            return None
        if command.action is CommandAction.ACQUIRE_GPUS:  # the hybrids sleep meanwhile; GPUS_READY follows
            await in_thread(self.backend.acquire_gpu)
            return None
        if command.action is CommandAction.SYNC_WEIGHTS:
            try:
                report = await self.sync_replicas(tuple(command.replica_ids), command.version,
                                                  command.weights_path)
            except CommandFailed as exc:  # a worker rejected or never acked its reload: a failed sync
                raise ValueError(str(exc)) from exc
            return report
        raise ValueError(f"unknown trainer action {command.action!r}")

    async def sync_replicas(self, replica_ids: tuple[str, ...], version: int,
                            weights_path: str) -> WeightSyncReport:
        """Push to the live replicas that have a push transport, one push per group of `push_plan`
        (standalones and hybrids apart, each over its transport; ipc: one replica at a time, so a hybrid
        that cannot take it fails alone); the replicas of a failed push, the gone ones (sent, not awaited:
        replayed on their return) and those without a push reload `version` from the filesystem."""
        alive = await self._alive(replica_ids)
        live_ids = tuple(r for r, up in zip(replica_ids, alive, strict=True) if up)
        plan = push_plan(self.transports, live_ids, self.roles)
        pushes: list[PushGroupReport] = []
        for transport, group in plan:
            started = time.monotonic()
            error = await self._push(group, version, transport)
            pushes.append(PushGroupReport(replica_ids=list(group), ok=not error, error=error,
                                          push_s=time.monotonic() - started, transport=transport))
            if error:
                log.warning("%s push of v%d to %s failed (%s): falling back to the filesystem", transport,
                            version, list(group), error)
        pushed_ok = {r for p in pushes if p.ok for r in p.replica_ids}
        reload = [(r, a) for r, a in zip(replica_ids, alive, strict=True) if r not in pushed_ok]
        if reload:
            await self._load_from_filesystem(tuple(r for r, _ in reload), [a for _, a in reload], version,
                                             weights_path)
        failed = [p for p in pushes if not p.ok]
        return WeightSyncReport(replica_ids=list(replica_ids), version=version,
                                transport="+".join(dict.fromkeys(t for t, _ in plan)), pushed=bool(plan),
                                ok=not failed, error="; ".join(p.error for p in failed),
                                push_s=sum(p.push_s for p in pushes), pushes=pushes)

    async def _push(self, replica_ids: tuple[str, ...], version: int, transport: str) -> str:
        """Push the held weights over `transport`; '' on success, else the error."""
        try:
            if version != self.cycle.version:
                raise ValueError(f"asked to push v{version} but holds v{self.cycle.version}")
            beats = await self.bus.redis.mget([self.bus.names.worker_heartbeat(r) for r in replica_ids])
            client = StreamSyncClient(rpc=self._push_rpc, names=self.bus.names,
                                      loop=asyncio.get_running_loop(), replica_ids=list(replica_ids),
                                      version=version,
                                      replica_world_size=self.config.rollout.tensor_model_parallel_size,
                                      incarnations=tuple(text(b) if b else "" for b in beats))
            await in_thread(self.backend.push_weights, transport, client)
        except Exception as exc:  # reported, not raised: the sync goes on through the filesystem
            return f"{type(exc).__name__}: {exc}"
        return ""

    async def _alive(self, replica_ids: tuple[str, ...]) -> list[bool]:
        """Which of `replica_ids` are serving (shared.peer_liveness), in order (one round trip). One
        still starting counts as gone here: it loads the newest weights itself when its engine is up
        (a vLLM start under load can outlast every ack deadline)."""
        return await serving(self.bus.redis, self.bus.names, replica_ids)

    async def _load_from_filesystem(self, replica_ids: tuple[str, ...], alive: list[bool], version: int,
                                    weights_path: str) -> None:
        """Send update_weights to every replica; wait for the acks of live ones only. A replica whose
        heartbeat expired, or that is unresponsive, gets the command too (replayed when it
        restarts) but is not waited for."""
        names = self.bus.names
        action = CommandAction.UPDATE_WEIGHTS
        for replica_id, is_alive in zip(replica_ids, alive, strict=True):
            if not is_alive:
                log.warning("replica %s has no heartbeat: update_weights sent, not awaited", replica_id)
                await self._rpc.send(names.worker_commands(replica_id), action, version=version,
                                     weights_path=weights_path)
        live = [(names.worker_commands(r), names.worker_heartbeat(r))
                for r, is_alive in zip(replica_ids, alive, strict=True) if is_alive]
        await self._rpc.call_peers(live, action, version=version, weights_path=weights_path)
