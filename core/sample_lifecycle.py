"""The rollouter's sample lifecycle: feed, pause latch, concurrency, monitor, enqueue, reset. Pure.

Where it sits: between the prompt feed and the MessageQueue. The rollouter service
(`services/rollouter`) drives it over Redis and the simulator (`sim/rollouter.py`) on its
virtual clock; both make every decision here, so they pause, resume, queue and report
alike. Time is passed in as `now_s`; the MessageQueue size as `mq_size` (samples queued and
not yet taken by the trainer). Per-trajectory progress (partial resume, retries) is
`core.sample_progress`.

A sample's life (`SampleState` in the accounting):

    next_sample (fed: generating) -> on_enqueued (queued) -> trained by the trainer

Nothing is ever dropped: the MessageQueue is bounded by backpressure only (the feed pauses
at max_queue_size and at the staleness limit; samples in flight still land in the queue).

Rules (reference 1.1, with the services' choices):
- the feed checks the pause condition and a free concurrency slot *before* taking a prompt,
  and a taken prompt counts toward staleness at once;
- the pause latches: only the monitor (every tick of its driver's monitor) or a reset un-pauses;
- an idle window opens when the monitor sees the feed paused with nothing generating, and
  closes when the feed resumes or the version ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import metrics as M
from core.flow import FlowLimits, StalenessTracker
from core.measure import HANDED_OVER, HANDED_OVER_ON_TIME, DecodeFit
from core.metrics import UtilizationHistory
from shared.names import RolloutStateField as F


def sample_id_at(index: int) -> str:
    """The stable id of the prompt fed at position `index`."""
    return f"sample_0_{index}"


def sample_index(sample_id: str) -> int:
    return int(sample_id.rsplit("_", 1)[1])


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutStatus:
    """The rollouter's status snapshot (the `rollouter_state` hash): what the controller reads."""

    paused: bool
    active_tasks: int
    feed_done: bool
    max_concurrent_samples: int = 0
    staleness_samples: int = 0
    idle_closed_s: float = 0.0
    """Seconds of the rollouter's closed idle windows (paused with nothing generating) since it started."""
    idle_since_s: float | None = None
    """When its open idle window began, on its clock (None: not idle)."""
    handed_over: int = 0
    """Samples a hybrid's abort handed to the standalones in this version (since the last reset)."""
    handed_over_on_time: int = 0
    """Of those, the samples queued since."""

    def idle_seconds(self, now_s: float) -> float:
        """Its idle seconds up to `now_s` (the rollouter's clock), the open window included: what the
        controller's rates leave out."""
        open_s = 0.0 if self.idle_since_s is None else max(0.0, now_s - self.idle_since_s)
        return self.idle_closed_s + open_s

    @property
    def stalled(self) -> bool:
        """No more samples will come without a sync: paused (or fed out) with nothing generating."""
        return (self.paused or self.feed_done) and self.active_tasks == 0

    def to_hash(self) -> dict[str, int | float | str]:
        return {F.PAUSED: int(self.paused), F.ACTIVE_TASKS: self.active_tasks,
                F.FEED_DONE: int(self.feed_done), F.MAX_CONCURRENT_SAMPLES: self.max_concurrent_samples,
                F.STALENESS_SAMPLES: self.staleness_samples, F.IDLE_CLOSED_S: self.idle_closed_s,
                F.IDLE_SINCE_S: "" if self.idle_since_s is None else self.idle_since_s,
                F.HANDED_OVER: self.handed_over, F.HANDED_OVER_ON_TIME: self.handed_over_on_time}

    @classmethod
    def from_hash(cls, state: dict[str, str]) -> RolloutStatus:
        """From the decoded hash; a rollouter that never wrote one reads as generating."""
        return cls(paused=state.get(F.PAUSED) == "1", active_tasks=int(state.get(F.ACTIVE_TASKS, 1)),
                   feed_done=state.get(F.FEED_DONE) == "1",
                   max_concurrent_samples=int(state.get(F.MAX_CONCURRENT_SAMPLES, 0)),
                   staleness_samples=int(state.get(F.STALENESS_SAMPLES, 0)),
                   idle_closed_s=float(state.get(F.IDLE_CLOSED_S) or 0.0),
                   idle_since_s=float(state[F.IDLE_SINCE_S]) if state.get(F.IDLE_SINCE_S) else None,
                   handed_over=int(state.get(F.HANDED_OVER, 0)),
                   handed_over_on_time=int(state.get(F.HANDED_OVER_ON_TIME, 0)))


class SampleLifecycle:
    """Which prompt to start next, and the staleness, utilization and idle bookkeeping around it."""

    def __init__(self, *, limits: FlowLimits, concurrent_samples_per_replica: int, now_s: float,
                 standalone_replicas: int | None = None,
                 hybrid_concurrent_samples_per_replica: int | None = None,
                 partial_rollout: bool = True) -> None:
        self.limits = limits
        self.partial_rollout = partial_rollout
        """False: no sample starts before the first weight version is live (`synced`). The first sync aborts
        what is in flight, and without partial rollout an aborted response is trained cut short; verl
        syncs before its rollouter starts."""
        self.synced = False
        """A weight version was made live (`reset`) in this run."""
        self.concurrent_samples_per_replica = concurrent_samples_per_replica
        self.standalone_replicas = standalone_replicas
        """The active replicas past this many are hybrids (None: every replica counts as a standalone)."""
        self.hybrid_concurrent_samples_per_replica = hybrid_concurrent_samples_per_replica
        self.tracker = StalenessTracker(limits=limits, now_s=now_s)
        self.history = UtilizationHistory(t0=now_s)
        """(time, active samples, capacity) since the last reset (section 4.2)."""
        self.active: set[str] = set()
        """Samples generating (fed, not yet queued)."""
        self.fed = 0
        self.cut_samples = 0
        """Samples queued because an abort ended their last response (partial rollout off): an abort's
        burst, not production over time (`core.measure.RateMeter` leaves them out of its windows)."""
        self.num_replicas = 0
        self.max_concurrent = 0
        self.version = 0
        self.idle = False
        self.decode = DecodeFit()
        """The version's finished attempts: seconds per token against the engine's load (core/measure.py)."""
        self.handed_over_pending: set[str] = set()
        """Samples a hybrid's abort handed to the standalones in this version, still generating."""
        self.handed_over_on_time = 0
        """Samples handed over in this version and queued since (before its sync)."""

    # ---- restart ----

    def restore(self, *, fed: int, total_generated: int, completed_steps: int, version: int,
                synced: bool, cut_samples: int = 0) -> None:
        """Counters read back after a restart."""
        self.fed = fed
        self.cut_samples = cut_samples
        self.tracker.total_generated = total_generated
        self.tracker.completed_steps = completed_steps
        self.version = version
        self.synced = synced

    def adopt(self, sample_id: str, now_s: float) -> None:
        """A sample still generating when the previous rollouter stopped is generated again."""
        self.active.add(sample_id)
        self._record(now_s)

    # ---- feed ----

    @property
    def feed_done(self) -> bool:
        return self.fed >= self.limits.total_rollout_steps

    def next_sample(self, *, mq_size: int, now_s: float) -> str | None:
        """The feed's step: latch the pause, then take the next prompt if a slot is free.
        None: paused, no free slot, or the feed is exhausted (wait for a change)."""
        if self.feed_done or not (self.partial_rollout or self.synced):
            return None
        if self.tracker.check_pause(mq_size) or len(self.active) >= self.max_concurrent:
            return None
        sample_id = sample_id_at(self.fed)
        self.fed += 1
        self.tracker.on_submit()
        self.active.add(sample_id)
        self._record(now_s)
        return sample_id

    @property
    def handed_over(self) -> int:
        """Samples handed over in this version: those still generating and those queued since (a queued
        sample is no longer active, so it cannot be handed over again)."""
        return len(self.handed_over_pending) + self.handed_over_on_time

    def on_handed_over(self, sample_id: str) -> None:
        """An attempt of a generating sample was aborted on a hybrid (its deactivation): the sample's work
        goes on on the standalones. Counted once per sample and version."""
        if sample_id in self.active:
            self.handed_over_pending.add(sample_id)

    def on_enqueued(self, sample_id: str, now_s: float, *, cut: bool = False) -> None:
        """Every trajectory finished and the sample was written to the MessageQueue (`cut`: the last one
        ended by an abort, partial rollout off)."""
        self.cut_samples += cut
        if sample_id in self.handed_over_pending:
            self.handed_over_pending.discard(sample_id)
            self.handed_over_on_time += 1
        self.active.discard(sample_id)
        self.tracker.on_generated()
        self._record(now_s)

    # ---- replicas, monitor, sync ----

    def set_replicas(self, num_replicas: int, now_s: float) -> None:
        """max_concurrent_samples is recomputed, and recorded in the utilization history, on every change."""
        self.num_replicas = num_replicas
        self.max_concurrent = self.limits.max_concurrent(
            num_replicas, self.concurrent_samples_per_replica, standalone_replicas=self.standalone_replicas,
            hybrid_concurrent_samples_per_replica=self.hybrid_concurrent_samples_per_replica)
        if self.max_concurrent:
            self.history.set_initial_capacity(self.max_concurrent)
        self._record(now_s)

    def monitor(self, *, mq_size: int, now_s: float) -> bool:
        """The monitor's tick: un-pause when the condition cleared (True: the feed may go on);
        open an idle window when paused with nothing generating."""
        if self.tracker.try_resume(mq_size):
            self._end_idle(now_s)
            return True
        if self.tracker.paused and not self.active and not self.idle:
            self.idle = True
            self.tracker.on_idle_start(now_s)
        return False

    def on_attempt_finished(self, *, tokens: int, seconds: float, inflight: float, context: float) -> None:
        """An attempt ran to its end (not aborted): `tokens` decoded in `seconds` on an engine holding
        `inflight` requests (itself included) and `context` tokens on average (0 = the engine did not say)."""
        self.decode.add(tokens=tokens, seconds=seconds, inflight=inflight, context=context)

    def reset(self, *, version: int, mq_size: int, now_s: float) -> dict[str, float]:
        """`reset_staleness`: version `version` is live; returns the version's rollouter metrics."""
        self._end_idle(now_s)
        report = self.tracker.reset(num_active=len(self.active), queue_size=mq_size, now_s=now_s)
        utilization = self.history.close(now_s)
        self.version = version
        self.synced = True
        limits = self.limits
        decode, self.decode = self.decode, DecodeFit()
        handed_over, on_time = self.handed_over, self.handed_over_on_time
        self.handed_over_pending, self.handed_over_on_time = set(), 0
        return {
            **decode.to_metrics(),
            HANDED_OVER: handed_over,
            HANDED_OVER_ON_TIME: on_time,
            M.STEP_GENERATED: report.step_generated_samples,
            M.ROLLOUTER_IDLE: report.idle_ratio,
            M.ROLLOUTER_VERSION_TIME: report.version_time_s,
            M.ROLLOUTER_ACTIVE_TIME: report.active_time_s,
            M.ROLLOUT_UTIL: utilization,
            M.ROLLOUTER_IDLE_ALL_WINDOWS: report.idle_ratio_all_windows,
            M.STALENESS_SAMPLES: report.staleness_samples,
            M.TOTAL_GENERATED: self.tracker.total_generated,
            M.DROPPED_STALE: self.tracker.dropped,
            M.ACTIVE_TASKS: len(self.active),
            M.MQ_QUEUE_SIZE: mq_size,
            M.MAX_CONCURRENT: self.max_concurrent,
            M.MAX_REQUIRED: limits.max_required,
            M.REQUIRED_SAMPLES: limits.required_samples,
            M.MAX_QUEUE_SIZE: limits.max_queue_size,
            M.STALENESS_THRESHOLD: limits.staleness_threshold,
        }

    def status(self) -> RolloutStatus:
        return RolloutStatus(paused=self.tracker.paused, active_tasks=len(self.active),
                             feed_done=self.feed_done, max_concurrent_samples=self.max_concurrent,
                             staleness_samples=self.tracker.staleness_samples,
                             idle_closed_s=self.tracker.idle_closed_total_s,
                             idle_since_s=self.tracker.idle_open_since_s,
                             handed_over=self.handed_over, handed_over_on_time=self.handed_over_on_time)

    def _end_idle(self, now_s: float) -> None:
        if self.idle:
            self.idle = False
            self.tracker.on_idle_end(now_s)

    def _record(self, now_s: float) -> None:
        self.history.record(now_s, len(self.active), self.max_concurrent)
