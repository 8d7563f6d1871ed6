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

from core.flow import FlowLimits
from core.sample_lifecycle import SampleLifecycle, sample_index
from core.sample_progress import SampleProgress, new_sample
from services.rollouter.prompts import PromptSource
from shared.bus import Bus, Subscription, text
from shared.config import ROLLOUTER_MONITOR_INTERVAL_S, Config
from shared.liveness import beat
from shared.names import ROLLOUTER_GROUP, TRAINER_GROUP, AccountingField, SampleState
from shared.names import RolloutStateField as F
from shared.runtime import sleep_unless, supervise
from shared.schema import (
    Command,
    CommandAction,
    GenerateRequest,
    GenerateResult,
    Regenerate,
    RolloutReport,
    Sample,
    encode,
)
from shared.streams import ensure_group, group_lag
from shared.vocab import FINISHED, FinishReason

log = logging.getLogger(__name__)
CONSUMER = "rollouter"
RETRY_POLL_S = 0.005


class Rollouter:
    """Drives `core.sample_lifecycle.SampleLifecycle` over Redis: every decision is the core's."""

    def __init__(self, *, bus: Bus, config: Config, prompts: PromptSource) -> None:
        self.bus = bus
        self.config = config
        self.prompts = prompts
        self.limits = FlowLimits.from_config(config)
        self.lifecycle = SampleLifecycle(
            limits=self.limits, now_s=time.time(),
            concurrent_samples_per_replica=config.async_training.concurrent_samples_per_replica,
            standalone_replicas=len(config.standalone_ids),
            hybrid_concurrent_samples_per_replica=config.async_training.hybrid_concurrent_samples_per_replica,
            partial_rollout=config.async_training.partial_rollout)
        self.hybrid_ids = frozenset(config.hybrid_ids)
        """An attempt aborted on one of these was handed to the standalones by a deactivation."""
        self.progress: dict[str, SampleProgress] = {}
        """Trajectory progress of every generating sample (the lifecycle's active set)."""
        self.epoch = 0
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
        regenerate = await self.bus.subscribe(names.rollouter_regenerate, ROLLOUTER_GROUP, CONSUMER)
        try:
            await supervise({"rollouter.feed": self._feed(stop),
                             "rollouter.collect": self._collect(results, stop),
                             "rollouter.regenerate": self._regenerate(regenerate, stop),
                             "rollouter.retries": self._send_retries(stop),
                             "rollouter.commands": self.bus.serve_commands(commands, stop, sender=CONSUMER,
                                                                           apply=self._apply),
                             "rollouter.monitor": self._monitor(stop)})
        finally:
            for sub in (results, commands, regenerate):
                await sub.close()

    async def _restore(self) -> None:
        names = self.bus.names
        state = {text(k): text(v) for k, v in (await self.bus.redis.hgetall(names.rollouter_state)).items()}
        self.epoch = int(await self.bus.redis.hincrby(names.rollouter_state, F.EPOCH, 1))
        self.lifecycle.restore(fed=int(state.get(F.FED, 0)),
                               total_generated=int(state.get(F.TOTAL_GENERATED, 0)),
                               completed_steps=int(state.get(F.COMPLETED_STEPS, 1)),
                               version=int(state.get(F.VERSION, 0)), synced=F.VERSION in state,
                               cut_samples=int(state.get(F.CUT_SAMPLES, 0)))
        self.lifecycle.set_replicas(int(state.get(F.NUM_REPLICAS, 0)), time.time())
        orphans = [text(sid) for sid, s in (await self.bus.redis.hgetall(names.sample_states)).items()
                   if text(s) == SampleState.GENERATING]
        for sample_id in sorted(orphans):
            await self._generate_again(sample_id, why="in flight when the previous rollouter stopped")

    async def _generate_again(self, sample_id: str, *, why: str) -> None:
        """A sample already `generating` in Redis that this rollouter does not hold: start it over."""
        log.warning("regenerating %s (%s)", sample_id, why)
        self.lifecycle.adopt(sample_id, time.time())
        await self._submit(self._new_progress(sample_id), record_feed=False)

    # -- feed ----------------------------------------------------------------------

    async def _feed(self, stop: asyncio.Event) -> None:
        """1. ask the lifecycle for the next prompt (it stops while paused or without a free
        slot); 2. send its n requests; 3. otherwise wait for a result, command or un-pause."""
        while not stop.is_set() and not self.lifecycle.feed_done:
            beat()
            was_paused = self.lifecycle.tracker.paused
            sample_id = self.lifecycle.next_sample(mq_size=await self._mq_size(), now_s=time.time())
            if sample_id is None:
                if self.lifecycle.tracker.paused != was_paused:
                    await self._publish_status()
                await self._wait_for_change(stop)
                continue
            await self._submit(self._new_progress(sample_id), record_feed=True)

    def _new_progress(self, sample_id: str) -> SampleProgress:
        prompt, answer = self.prompts.prompt_at(sample_index(sample_id))
        return new_sample(sample_id=sample_id, prompt_token_ids=prompt, answer=answer, n=self.config.data.n,
                          max_tokens=self.config.data.max_response_length, epoch=self.epoch)

    async def _submit(self, progress: SampleProgress, *, record_feed: bool) -> None:
        names = self.bus.names
        self.progress[progress.sample_id] = progress
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            if record_feed:
                pipe.hset(names.sample_states, progress.sample_id, SampleState.GENERATING)
                pipe.hincrby(names.accounting, AccountingField.FED, 1)
                pipe.hincrby(names.accounting, AccountingField.GENERATING, 1)
                pipe.hset(names.rollouter_state, F.FED, self.lifecycle.fed)
            for request in progress.first_requests():
                pipe.xadd(names.lb_requests, encode(request))
            await pipe.execute()
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
        progress = self.progress.get(result.sample_id)
        if progress is None:
            return  # a duplicate of a sample already queued
        if result.finish_reason == FinishReason.ABORT and result.replica_id in self.hybrid_ids:
            self.lifecycle.on_handed_over(result.sample_id)
        if result.finish_reason in FINISHED:
            self.lifecycle.on_attempt_finished(tokens=result.decode_tokens, seconds=result.decode_time_s,
                                               inflight=result.mean_inflight_requests,
                                               context=result.mean_context_tokens)
        retry = progress.apply(result, partial_rollout=self.config.async_training.partial_rollout)
        if retry is not None:
            delay_s = self.config.rollout.retry_delay_s * self.config.run.time_scale
            self._retries.append((time.monotonic() + delay_s, retry))
        elif progress.done:  # cut if this result's abort ended the last response (partial rollout off)
            ended = progress.trajectory(result.request_id).finish_reason
            await self._enqueue(progress, cut=ended == FinishReason.ABORT)

    async def _regenerate(self, sub: Subscription, stop: asyncio.Event) -> None:
        """Generate again each sample the trainer found queued without a MessageQueue entry (it moved it
        back to generating: services/trainer/vanished.py); a copy of the request, or one for a sample
        already regenerating or queued again, changes nothing."""
        while not stop.is_set():
            batch = await sub.read(count=256, block_ms=200)
            ids = [m.sample_id for _, m in batch if isinstance(m, Regenerate)]
            states = await self.bus.redis.hmget(self.bus.names.sample_states, ids) if ids else []
            for sample_id, state in zip(ids, states, strict=True):
                if text(state or b"") == SampleState.GENERATING and sample_id not in self.progress:
                    await self._generate_again(sample_id, why="queued, but its MessageQueue entry vanished")
            await sub.ack(*(entry_id for entry_id, _ in batch))

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
            beat()
            await asyncio.sleep(RETRY_POLL_S)

    async def _enqueue(self, progress: SampleProgress, *, cut: bool = False) -> None:
        """Score, then XADD to the MessageQueue and move the sample to 'queued' in one transaction."""
        names = self.bus.names
        trajectories = [t.to_trajectory(reward=self.prompts.reward(
            response_token_ids=t.token_ids, answer=progress.answer, request_id=t.request_id,
            version=t.max_version or 0)) for t in progress.trajectories]
        sample = Sample(sample_id=progress.sample_id, prompt_token_ids=progress.prompt_token_ids,
                        answer=progress.answer, trajectories=trajectories, enqueued_at=time.time())
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(names.mq, encode(sample))
            pipe.hset(names.sample_states, progress.sample_id, SampleState.QUEUED)
            pipe.hincrby(names.accounting, AccountingField.GENERATING, -1)
            pipe.hincrby(names.accounting, AccountingField.QUEUED, 1)
            pipe.hincrby(names.rollouter_state, F.TOTAL_GENERATED, 1)
            if cut:
                pipe.hincrby(names.rollouter_state, F.CUT_SAMPLES, 1)
            await pipe.execute()
        del self.progress[progress.sample_id]
        self.lifecycle.on_enqueued(progress.sample_id, time.time(), cut=cut)
        await self._publish_status()
        self._changed.set()

    # -- commands from the controller ------------------------------------------------

    async def _apply(self, command: Command) -> RolloutReport:
        metrics: dict[str, float] = {}
        if command.action is CommandAction.SET_ACTIVE_REPLICAS:
            self.lifecycle.set_replicas(command.value, time.time())
            await self.bus.redis.hset(self.bus.names.rollouter_state, F.NUM_REPLICAS, command.value)
            await self._publish_status(await self._mq_size())
        elif command.action is CommandAction.RESET_STALENESS:
            mq_size = await self._mq_size()
            metrics = self.lifecycle.reset(version=command.version, mq_size=mq_size, now_s=time.time())
            await self._publish_status(mq_size)
            await self.bus.redis.hset(self.bus.names.rollouter_state, mapping={
                F.COMPLETED_STEPS: self.lifecycle.tracker.completed_steps, F.VERSION: command.version})
        else:
            raise ValueError(f"unknown rollouter action {command.action!r}")
        self._changed.set()
        return RolloutReport(max_concurrent_samples=self.lifecycle.max_concurrent, metrics=metrics)

    # -- monitor ---------------------------------------------------------------------

    async def _monitor(self, stop: asyncio.Event) -> None:
        """Every ROLLOUTER_MONITOR_INTERVAL_S: the lifecycle's monitor tick, then a status snapshot."""
        while not stop.is_set():
            mq_size = await self._mq_size()
            if self.lifecycle.monitor(mq_size=mq_size, now_s=time.time()):
                self._changed.set()
            await self._publish_status(mq_size)
            await sleep_unless(stop, ROLLOUTER_MONITOR_INTERVAL_S)

    async def _publish_status(self, mq_size: int | None = None) -> None:
        """Snapshot for the controller (its wait for samples ends early if we are blocked) and humans.
        Written after every change of the active set, pause flag or feed, so it is never stale."""
        status: dict[Any, Any] = dict(self.lifecycle.status().to_hash())
        if mq_size is not None:
            status[F.MQ_SIZE] = mq_size
        await self.bus.redis.hset(self.bus.names.rollouter_state, mapping=status)

    async def _mq_size(self) -> int:
        return await group_lag(self.bus.redis, self.bus.names.mq, TRAINER_GROUP)

    async def _wait_for_change(self, stop: asyncio.Event) -> None:
        """Wake on a result, a command, or the monitor's un-pause (bounded, so `stop` is seen)."""
        self._changed.clear()
        await sleep_unless(self._changed, ROLLOUTER_MONITOR_INTERVAL_S)
