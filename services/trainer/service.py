"""The trainer service: consumes the MessageQueue, trains micro-steps, publishes weights.

Where it sits: it reads `required_samples` per micro-step from the
MessageQueue through the trainer consumer group, and talks to the controller
over a step-phase handshake so it never computes while hybrids hold its GPUs:

    micro_step_start -> (controller may deactivate hybrids) -> gpus_ready
    collect + train + ack samples
    every trigger_parameter_sync_step micro-steps:
        weights_ready(v+1) -> (controller syncs, may ask release_gpus) -> sync_done
    micro_step_done (the step's metrics)

The first sync (version 0, global_steps 0) happens before training, as in
the original: it is the first chance to activate hybrids.

Clean stop: the current step finishes its handshake or is abandoned; unacked
samples stay pending. Crash: samples taken but not trained are replayed from
the consumer group on restart; global_steps and the version are read back
from Redis, so training continues where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Protocol

from core.flow import FlowLimits
from core.metrics import (
    partial_rollout_stats,
    processing_time_stats,
    stale_trajectory_count,
    train_compute_time_s,
)
from services.trainer.weight_push import StreamSyncClient
from shared.bus import Bus, Subscription, text
from shared.config import Config
from shared.names import TRAINER_GROUP
from shared.rpc import CommandClient
from shared.schema import MalformedMessage, Sample, TrainerEvent, TrainerReply, decode
from shared.streams import StreamConsumer, group_lag

log = logging.getLogger(__name__)
CONSUMER = "trainer"
PUSH_CALL_TIMEOUT_S = 300.0


class TrainerBackend(Protocol):
    def train_micro_step(self, samples: list[Any]) -> dict[str, float]: ...

    def export_weights(self, version: int) -> str | None: ...

    def release_gpu(self) -> None: ...

    def acquire_gpu(self) -> None: ...

    def save_checkpoint(self, version: int) -> object: ...

    def resume_latest(self) -> int | None: ...

    def push_weights(self, transport: str, client: Any) -> None:
        """Push the current weights to the replicas behind `client` (a StreamSyncClient)."""


async def claim_run_id(bus: Bus) -> str:
    """This run's id (kept in trainer_state), so a restarted trainer finds its own weights and
    checkpoints, and a new run never reads an earlier run's files under the same work_dir."""
    key = bus.names.trainer_state
    await bus.redis.hsetnx(key, "run_id", time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    return text(await bus.redis.hget(key, "run_id"))


class StopRequested(Exception):
    """The controller (or a signal) asked the trainer to stop."""


class Trainer:
    def __init__(self, *, bus: Bus, config: Config, backend: TrainerBackend) -> None:
        self.bus = bus
        self.config = config
        self.backend = backend
        at = config.async_training
        self.limits = FlowLimits.from_config(config)
        self.total_micro_steps = self.limits.total_train_steps * at.trigger_parameter_sync_step
        self.global_steps = 1
        self.version = 0
        self.stale_trajectories = 0
        self._rpc: CommandClient | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """1. restore progress; 2. initial sync at v0; 3. micro-steps until the configured total;
        4. tell the controller we are done, and idle until stopped."""
        names = self.bus.names
        state = {text(k): text(v) for k, v in (await self.bus.redis.hgetall(names.trainer_state)).items()}
        self.global_steps = int(state.get("global_steps", 1))
        self.version = int(state.get("version", 0))
        self.stale_trajectories = int(state.get("stale_trajectories", 0))
        if self.version > 0:
            resumed = await asyncio.to_thread(self.backend.resume_latest)
            if resumed != self.version:
                log.warning("trainer state says version %d but the newest checkpoint is %s", self.version, resumed)
        replies = await self.bus.subscribe(names.trainer_replies, TRAINER_GROUP, CONSUMER)
        mq = StreamConsumer(self.bus.redis, stream=names.mq, group=TRAINER_GROUP, consumer=CONSUMER,
                            dead_letter_stream=names.dead_letters, lease_key_prefix=names.lease(""))
        await mq.start()
        try:
            if state.get("initial_sync_done") != "1":
                await self._sync(replies, stop, global_steps=0)
                await self.bus.redis.hset(names.trainer_state, "initial_sync_done", 1)
            while self.global_steps <= self.total_micro_steps and not stop.is_set():
                await self._micro_step(replies, mq, stop)
            if not stop.is_set():
                await self.bus.publish(names.trainer_events, TrainerEvent(
                    phase="done", global_steps=self.global_steps - 1, version=self.version))
                await stop.wait()  # like every service, run until told to stop (then exit 0)
        except StopRequested:
            log.info("trainer stopping at global_steps=%d", self.global_steps)
        finally:
            await replies.close()
            await mq.aclose()
            if self._rpc is not None:
                await self._rpc.close()

    async def _micro_step(self, replies: Subscription, mq: StreamConsumer, stop: asyncio.Event) -> None:
        """One fit step (reference 1.3): handshake, collect, train, ack, maybe sync, report."""
        names = self.bus.names
        gs = self.global_steps
        step_started = time.monotonic()
        await self.bus.publish(names.trainer_events, TrainerEvent(phase="micro_step_start", global_steps=gs,
                                                                  version=self.version))
        ready = await self._await_reply(replies, stop, action="gpus_ready", global_steps=gs)
        await asyncio.to_thread(self.backend.acquire_gpu)
        alloc_started = time.monotonic()
        queue_before = await group_lag(self.bus.redis, names.mq, TRAINER_GROUP)
        required = self.limits.required_samples
        entry_ids, samples = await self._collect(mq, required, stop)
        gen_s = time.monotonic() - alloc_started
        wait_samples = max(0, required - queue_before)
        await self.bus.publish(names.trainer_events, TrainerEvent(
            phase="collected", global_steps=gs, version=self.version,
            data={"wait_time_s": gen_s, "wait_samples": wait_samples}))
        await self.bus.audit(kind="phase", subject="trainer", detail=f"train_start {gs}", version=self.version)
        timings = await asyncio.to_thread(self.backend.train_micro_step, samples)
        await self.bus.audit(kind="phase", subject="trainer", detail=f"train_end {gs}", version=self.version)
        await self._mark_trained(mq, entry_ids, samples)
        mq_size = await group_lag(self.bus.redis, names.mq, TRAINER_GROUP)
        metrics = self._sample_metrics(samples)
        sync_s = 0.0
        if gs % self.config.async_training.trigger_parameter_sync_step == 0:
            self.version += 1
            await asyncio.to_thread(self.backend.save_checkpoint, self.version)
            sync_started = time.monotonic()
            await self._sync(replies, stop, global_steps=gs)
            sync_s = time.monotonic() - sync_started
        self.global_steps += 1
        await self.bus.redis.hset(names.trainer_state, mapping={
            "global_steps": self.global_steps, "version": self.version,
            "stale_trajectories": self.stale_trajectories})
        step_s = time.monotonic() - step_started
        metrics.update(timings)
        metrics.update({
            "timing_s/gen": gen_s, "timing_s/step": step_s, "timing_s/param_sync": sync_s,
            "timing_s/wait_for_enough_samples": float(ready.data.get("wait_for_enough_samples_s", 0.0)),
            "timing_s/deactivate": float(ready.data.get("deactivate_s", 0.0)),
            "fully_async/total_wait_time": gen_s,
            "fully_async/wait_samples": float(wait_samples),
            "dynamic_resource/train_compute_time_s": train_compute_time_s(
                {k.removeprefix("timing_s/"): v for k, v in timings.items()}),
            "dynamic_resource/train_allocated_time_s": time.monotonic() - alloc_started,
            "dynamic_resource/mq_size": float(mq_size),
            "training/global_step": float(gs),
            "fully_async/count/current_param_version": float(self.version),
        })
        await self.bus.publish(names.trainer_events, TrainerEvent(
            phase="micro_step_done", global_steps=gs, version=self.version, data=metrics))

    async def _collect(self, mq: StreamConsumer, required: int,
                       stop: asyncio.Event) -> tuple[list[bytes], list[Sample]]:
        """Pop `required` samples (own pending ones first after a restart); malformed ones are dead-lettered."""
        entry_ids: list[bytes] = []
        samples: list[Sample] = []
        while len(samples) < required:
            if stop.is_set():
                raise StopRequested
            for entry in await mq.read(count=required - len(samples), block_ms=200):
                try:
                    message = decode(entry.fields)
                except MalformedMessage as exc:
                    await mq.dead_letter(entry, reason=f"malformed: {exc}")
                    continue
                if isinstance(message, Sample):
                    entry_ids.append(entry.entry_id)
                    samples.append(message)
                else:
                    await mq.dead_letter(entry, reason=f"not a sample: {type(message).__name__}")
        return entry_ids, samples

    async def _mark_trained(self, mq: StreamConsumer, entry_ids: list[bytes], samples: list[Sample]) -> None:
        """XACK and move the samples to 'trained' in one transaction (exactly-once accounting)."""
        names = self.bus.names
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.xack(names.mq, TRAINER_GROUP, *entry_ids)
            for sample in samples:
                pipe.hset(names.sample_states, sample.sample_id, "trained")
            pipe.hincrby(names.accounting, "queued", -len(samples))
            pipe.hincrby(names.accounting, "trained", len(samples))
            await pipe.execute()
        await mq.ack(entry_ids)  # already acked above; this only clears the consumer's hand-out record

    def _sample_metrics(self, samples: list[Sample]) -> dict[str, float]:
        trajectories = [t for s in samples for t in s.trajectories]
        self.stale_trajectories += stale_trajectory_count(self.version, (t.max_version for t in trajectories))
        rewards = [t.reward for t in trajectories]
        tokens = sum(len(t.response_token_ids) for t in trajectories)
        return {
            **partial_rollout_stats([(t.min_version, t.max_version) for t in trajectories]),
            **processing_time_stats(t.generation_time_s for t in trajectories),
            "fully_async/count/stale_trajectory_processed": float(self.stale_trajectories),
            "training/reward_mean": sum(rewards) / max(1, len(rewards)),
            "response_length/mean": tokens / max(1, len(trajectories)),
            "perf/total_num_tokens": float(tokens),
        }

    async def _sync(self, replies: Subscription, stop: asyncio.Event, *, global_steps: int) -> None:
        path = await asyncio.to_thread(self.backend.export_weights, self.version)
        # What a (re)starting rollout worker loads before it serves (see RolloutWorker.run).
        await self.bus.redis.hset(self.bus.names.trainer_state,
                                  mapping={"weights_version": self.version, "weights_path": path or ""})
        await self.bus.publish(self.bus.names.trainer_events, TrainerEvent(
            phase="weights_ready", global_steps=global_steps, version=self.version, weights_path=path or ""))
        await self._await_reply(replies, stop, action="sync_done", global_steps=global_steps)

    async def _push(self, message: TrainerReply) -> None:
        """Run the push the controller asked for and report it; on failure the controller falls
        back to the filesystem copy this version already has."""
        transport = str(message.data.get("transport", ""))
        replica_ids = [str(r) for r in message.data.get("replica_ids", [])]
        started = time.monotonic()
        error = ""
        try:
            if message.data.get("version") != self.version:
                raise ValueError(f"asked to push v{message.data.get('version')} but holds v{self.version}")
            if self._rpc is None:
                self._rpc = CommandClient(self.bus, timeout_s=PUSH_CALL_TIMEOUT_S, max_attempts=1)
                await self._rpc.start()
            beats = await self.bus.redis.mget([self.bus.names.worker_heartbeat(r) for r in replica_ids])
            client = StreamSyncClient(rpc=self._rpc, names=self.bus.names, loop=asyncio.get_running_loop(),
                                      replica_ids=replica_ids, version=self.version,
                                      replica_world_size=self.config.rollout.tensor_model_parallel_size,
                                      incarnations=tuple(text(b) if b else "" for b in beats))
            await asyncio.to_thread(self.backend.push_weights, transport, client)
        except Exception as exc:  # reported, not raised: the sync goes on through the filesystem
            error = f"{type(exc).__name__}: {exc}"
            log.warning("%s push of v%d to %s failed: %s", transport, self.version, replica_ids, error)
        await self.bus.publish(self.bus.names.trainer_events, TrainerEvent(
            phase="weights_pushed", global_steps=message.global_steps, version=self.version,
            data={"ok": not error, "error": error, "transport": transport, "replica_ids": replica_ids,
                  "push_s": time.monotonic() - started}))

    async def _await_reply(self, replies: Subscription, stop: asyncio.Event, *, action: str,
                           global_steps: int) -> TrainerReply:
        """Wait for the controller's `action` for this step; serve release_gpus requests meanwhile."""
        while True:
            if stop.is_set():
                raise StopRequested
            for entry_id, message in await replies.read(count=8, block_ms=200):
                await replies.ack(entry_id)
                if not isinstance(message, TrainerReply):
                    continue
                if message.action == "stop":
                    raise StopRequested
                if message.action == "release_gpus":
                    await asyncio.to_thread(self.backend.release_gpu)
                    await self.bus.publish(self.bus.names.trainer_events, TrainerEvent(
                        phase="gpus_released_ack", global_steps=message.global_steps, version=self.version))
                elif message.action == "push_weights":
                    await self._push(message)
                elif message.action == action and message.global_steps == global_steps:
                    return message
