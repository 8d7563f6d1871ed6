"""The rollouter: feeds prompts, keeps generation within the staleness and concurrency
limits, resumes partial rollouts, scores samples and writes them to the MessageQueue.

Where it sits: it sends GenerateRequests to the load balancer and reads their
results back; finished samples go to the MessageQueue stream (`mq`), which the
trainer's consumer group reads. The controller tells it how many replicas
serve (`set_active_replicas`, which recomputes max_concurrent_samples) and when
a weight version ends (`reset_staleness`, which returns the rollouter's
per-version metrics).

Every sample's life is recorded atomically with the stream write that
changes it (fed -> generating -> queued; the trainer moves it to trained),
so `fed = generating + queued + trained + dropped` holds at every moment.

Clean stop: loops end; generating samples stay 'generating' in Redis.
Crash/restart: the feed counter and totals are read back from Redis, and
every sample still 'generating' is regenerated from its prompt under a new
epoch of attempt numbers, so late results of the old attempts are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from core.flow import FlowLimits, StalenessTracker
from core.metrics import UtilizationHistory
from services.rollouter.progress import SampleProgress, new_sample
from services.rollouter.prompts import PromptSource
from shared.bus import Bus, Subscription, text
from shared.config import Config
from shared.names import ROLLOUTER_GROUP, TRAINER_GROUP
from shared.runtime import sleep_unless
from shared.schema import Command, GenerateRequest, GenerateResult, Sample, encode
from shared.streams import ensure_group, group_lag

log = logging.getLogger(__name__)
CONSUMER = "rollouter"
MONITOR_INTERVAL_S = 0.1
RETRY_POLL_S = 0.005


class Rollouter:
    def __init__(self, *, bus: Bus, config: Config, prompts: PromptSource) -> None:
        self.bus = bus
        self.config = config
        self.prompts = prompts
        self.limits = FlowLimits.from_config(config)
        self.tracker = StalenessTracker(limits=self.limits, now_s=time.time())
        self.history = UtilizationHistory(t0=time.time())
        self.active: dict[str, SampleProgress] = {}
        self.num_replicas = 0
        self.max_concurrent = 0
        self.fed = 0
        self.epoch = 0
        self.version = 0
        self._changed = asyncio.Event()
        self._retries: list[tuple[float, GenerateRequest]] = []
        """(due time, request) of partial rollouts waiting out the retry delay."""

    # -- lifecycle ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """1. restore counters and regenerate orphaned samples; 2. feed, collect results,
        obey commands and monitor the pause condition until `stop`."""
        names = self.bus.names
        await ensure_group(self.bus.redis, names.mq, TRAINER_GROUP)
        await self._restore()
        results = await self.bus.subscribe(names.rollouter_results, ROLLOUTER_GROUP, CONSUMER)
        commands = await self.bus.subscribe(names.rollouter_commands, ROLLOUTER_GROUP, CONSUMER)
        try:
            await asyncio.gather(self._feed(stop), self._collect(results, stop), self._send_retries(stop),
                                 self.bus.serve_commands(commands, stop, sender=CONSUMER, apply=self._apply),
                                 self._monitor(stop))
        finally:
            await results.close()
            await commands.close()

    async def _restore(self) -> None:
        names = self.bus.names
        state = {text(k): text(v) for k, v in (await self.bus.redis.hgetall(names.rollouter_state)).items()}
        self.epoch = int(await self.bus.redis.hincrby(names.rollouter_state, "epoch", 1))
        self.fed = int(state.get("fed", 0))
        self.tracker.total_generated = int(state.get("total_generated", 0))
        self.tracker.completed_steps = int(state.get("completed_steps", 1))
        self.version = int(state.get("version", 0))
        self._set_replicas(int(state.get("num_replicas", 0)))
        orphans = [text(sid) for sid, s in (await self.bus.redis.hgetall(names.sample_states)).items()
                   if text(s) == "generating"]
        for sample_id in sorted(orphans):
            log.warning("regenerating %s (in flight when the previous rollouter stopped)", sample_id)
            await self._submit(self._new_progress(sample_id), record_feed=False)
        self.history.record(time.time(), len(self.active), self.max_concurrent)

    # -- feed ----------------------------------------------------------------------

    async def _feed(self, stop: asyncio.Event) -> None:
        """1. stop feeding while paused (staleness / queue full); 2. wait for a free concurrency
        slot; 3. take the next prompt and send its n requests."""
        total = self.config.data.total_rollout_steps
        while not stop.is_set() and self.fed < total:
            was_paused = self.tracker.paused
            if self.tracker.check_pause(await self._mq_size()) or len(self.active) >= self.max_concurrent:
                if self.tracker.paused != was_paused:
                    await self._publish_status()
                await self._wait_for_change(stop)
                continue
            sample_id = f"sample_0_{self.fed}"
            self.fed += 1
            self.tracker.on_submit()
            await self._submit(self._new_progress(sample_id), record_feed=True)

    def _new_progress(self, sample_id: str) -> SampleProgress:
        prompt, answer = self.prompts.prompt_at(int(sample_id.rsplit("_", 1)[1]))
        return new_sample(sample_id=sample_id, prompt_token_ids=prompt, answer=answer, n=self.config.data.n,
                          max_tokens=self.config.data.max_response_length, epoch=self.epoch)

    async def _submit(self, progress: SampleProgress, *, record_feed: bool) -> None:
        names = self.bus.names
        self.active[progress.sample_id] = progress
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            if record_feed:
                pipe.hset(names.sample_states, progress.sample_id, "generating")
                pipe.hincrby(names.accounting, "fed", 1)
                pipe.hincrby(names.accounting, "generating", 1)
                pipe.hset(names.rollouter_state, "fed", self.fed)
            for request in progress.first_requests():
                pipe.xadd(names.lb_requests, encode(request))
            await pipe.execute()
        self.history.record(time.time(), len(self.active), self.max_concurrent)
        await self._publish_status()

    # -- results -------------------------------------------------------------------

    async def _collect(self, sub: Subscription, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await sub.read(count=256, block_ms=200)
            for _, message in batch:
                if isinstance(message, GenerateResult):
                    await self._on_result(message)
            await sub.ack(*(entry_id for entry_id, _ in batch))

    async def _on_result(self, result: GenerateResult) -> None:
        progress = self.active.get(result.sample_id)
        if progress is None:
            return  # a duplicate of a sample already queued
        retry = progress.apply(result, partial_rollout=self.config.async_training.partial_rollout)
        if retry is not None:
            delay_s = self.config.rollout.retry_delay_s * self.config.run.time_scale
            self._retries.append((time.monotonic() + delay_s, retry))
        elif progress.done:
            await self._enqueue(progress)

    async def _send_retries(self, stop: asyncio.Event) -> None:
        """The original client sleeps 1 s before re-acquiring; the LB then picks a serving replica.
        Due retries go out in one pipeline, so a sync that aborts hundreds of requests costs one
        round trip, and a failed send keeps them queued (never dropped)."""
        while not stop.is_set():
            now = time.monotonic()
            due = [r for t, r in self._retries if t <= now]
            if due:
                await self.bus.publish_many([(self.bus.names.lb_requests, r) for r in due])
                self._retries = [(t, r) for t, r in self._retries if t > now]
            await asyncio.sleep(RETRY_POLL_S)

    async def _enqueue(self, progress: SampleProgress) -> None:
        """Score, then XADD to the MessageQueue and move the sample to 'queued' in one transaction."""
        names = self.bus.names
        trajectories = [t.to_trajectory(reward=self.prompts.reward(
            response_token_ids=t.token_ids, answer=progress.answer, request_id=t.request_id,
            version=t.max_version or 0)) for t in progress.trajectories]
        sample = Sample(sample_id=progress.sample_id, prompt_token_ids=progress.prompt_token_ids,
                        answer=progress.answer, trajectories=trajectories, enqueued_at=time.time())
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(names.mq, encode(sample))
            pipe.hset(names.sample_states, progress.sample_id, "queued")
            pipe.hincrby(names.accounting, "generating", -1)
            pipe.hincrby(names.accounting, "queued", 1)
            pipe.hincrby(names.rollouter_state, "total_generated", 1)
            await pipe.execute()
        del self.active[progress.sample_id]
        self.tracker.on_generated()
        self.history.record(time.time(), len(self.active), self.max_concurrent)
        await self._publish_status()
        self._changed.set()

    # -- commands from the controller ------------------------------------------------

    async def _apply(self, command: Command) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if command.action == "set_active_replicas":
            self._set_replicas(command.value)
            await self.bus.redis.hset(self.bus.names.rollouter_state, "num_replicas", command.value)
            await self._publish_status(await self._mq_size())
            data["max_concurrent_samples"] = self.max_concurrent
        elif command.action == "reset_staleness":
            data = await self._reset_staleness(command.version)
        else:
            raise ValueError(f"unknown rollouter action {command.action!r}")
        self._changed.set()
        return data

    def _set_replicas(self, num_replicas: int) -> None:
        """max_concurrent_samples is recomputed, and recorded in the utilization history, on every change."""
        self.num_replicas = num_replicas
        self.max_concurrent = self.limits.max_concurrent(
            num_replicas, self.config.async_training.concurrent_samples_per_replica)
        if self.max_concurrent:
            self.history.set_initial_capacity(self.max_concurrent)
        self.history.record(time.time(), len(self.active), self.max_concurrent)

    async def _reset_staleness(self, version: int) -> dict[str, float]:
        now = time.time()
        mq_size = await self._mq_size()
        report = self.tracker.reset(num_active=len(self.active), queue_size=mq_size, now_s=now)
        await self._publish_status(mq_size)
        utilization = self.history.close(now)
        self.history.record(now, len(self.active), self.max_concurrent)
        self.version = version
        await self.bus.redis.hset(self.bus.names.rollouter_state, mapping={
            "completed_steps": self.tracker.completed_steps, "version": version})
        return {
            "fully_async/rollouter/step_generated_samples": report.step_generated_samples,
            "fully_async/rollouter/idle_ratio": report.idle_ratio,
            "fully_async/rollouter/version_time_s": report.version_time_s,
            "fully_async/rollouter/active_time_s": report.active_time_s,
            "dynamic_resource/rollout_resource_utilization": utilization,
            "fully_async/rollouter/idle_ratio_all_windows": report.idle_ratio_all_windows,
            "fully_async/count/staleness_samples": report.staleness_samples,
            "fully_async/count/total_generated_samples": self.tracker.total_generated,
            "fully_async/count/dropped_stale_samples": self.tracker.dropped,
            "fully_async/monitor/active_tasks_size": len(self.active),
            "fully_async/monitor/queue/mq_queue_size": mq_size,
            "fully_async/static/max_concurrent_samples": self.max_concurrent,
            "fully_async/static/max_required_samples": self.limits.max_required,
            "fully_async/static/required_samples": self.limits.required_samples,
            "fully_async/static/max_queue_size": self.limits.max_queue_size,
            "fully_async/static/staleness_threshold": self.limits.staleness_threshold,
        }

    # -- monitor ---------------------------------------------------------------------

    async def _monitor(self, stop: asyncio.Event) -> None:
        """Un-pause when the condition clears, track idle windows, publish a status snapshot."""
        while not stop.is_set():
            mq_size = await self._mq_size()
            now = time.time()
            if self.tracker.try_resume(mq_size):
                self.tracker.on_idle_end(now)
                self._changed.set()
            elif self.tracker.paused and not self.active:
                self.tracker.on_idle_start(now)
            await self._publish_status(mq_size)
            await sleep_unless(stop, MONITOR_INTERVAL_S)

    async def _publish_status(self, mq_size: int | None = None) -> None:
        """Snapshot for the controller (its wait for samples ends early if we are blocked) and humans.
        Written after every change of the active set, pause flag or feed, so it is never stale."""
        status: dict[Any, Any] = {"paused": int(self.tracker.paused), "active_tasks": len(self.active),
                  "feed_done": int(self.fed >= self.config.data.total_rollout_steps),
                  "max_concurrent_samples": self.max_concurrent, "staleness_samples": self.tracker.staleness_samples}
        if mq_size is not None:
            status["mq_size"] = mq_size
        await self.bus.redis.hset(self.bus.names.rollouter_state, mapping=status)

    async def _mq_size(self) -> int:
        return await group_lag(self.bus.redis, self.bus.names.mq, TRAINER_GROUP)

    async def _wait_for_change(self, stop: asyncio.Event) -> None:
        """Wake on a result, a command, or the monitor's un-pause (bounded, so `stop` is seen)."""
        self._changed.clear()
        await sleep_unless(self._changed, MONITOR_INTERVAL_S)
