"""Rollouter flow control: how many samples may be generating, and when to pause.

Where it sits: under ``core.sample_lifecycle``, which the rollouter service and
the simulator drive: prompts are fed only while ``StalenessTracker.should_pause``
is False and fewer than ``FlowLimits.max_concurrent`` samples are in flight; at
every weight sync the controller tells the rollouter to ``reset`` staleness. Pure: no I/O, and
time is always passed in as ``now_s`` (seconds on any monotonic clock).

Formulas (verl fully-async, reference section 1.2; every count is in samples,
one sample = one prompt x ``rollout.n``)::

    required        = ppo_mini_batch_size * require_batches
    step_required   = required * trigger_parameter_sync_step
    max_required    = int(required * (staleness_threshold + 1) * trigger_parameter_sync_step)
    max_queue_size  = max_required
    total_train_steps = int(total_rollout_steps / step_required)
    max_concurrent  = min(active_replicas * concurrent_samples_per_replica, max_required)
                      (with hybrid_concurrent_samples_per_replica set, each active hybrid counts that
                      many instead: an extension, the seed's formula when it is not set)

Pause when ``queue_size >= max_queue_size`` or ``staleness_samples >=
max_required``. At reset: un-pause, ``staleness_samples = num_active +
queue_size``, ``completed_steps += 1`` only if this version generated
something (starts at 1), then zero ``step_generated``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import Config


def total_rollout_steps(*, configured: int, dataset_size: int, total_epochs: int) -> int:
    """``min(configured, dataset_size * total_epochs)``: prompts the feed will emit."""
    named = (("configured", configured), ("dataset_size", dataset_size), ("total_epochs", total_epochs))
    for name, value in named:
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return min(configured, dataset_size * total_epochs)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlowLimits:
    """The static limits of one run, derived from the original's config names."""

    ppo_mini_batch_size: int
    """Samples per mini-batch (prompts, not trajectories)."""
    require_batches: int
    """Mini-batches the trainer pulls per micro-step."""
    trigger_parameter_sync_step: int
    """Micro-steps per weight version."""
    staleness_threshold: float
    """Extra fraction of a version's samples that may be generated ahead (>= 0)."""
    total_rollout_steps: int
    """Prompts the feed emits in the whole run."""

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "require_batches", "trigger_parameter_sync_step"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {self.staleness_threshold}")
        if self.total_rollout_steps < 0:
            raise ValueError(f"total_rollout_steps must be >= 0, got {self.total_rollout_steps}")

    @property
    def required_samples(self) -> int:
        """Samples the trainer pulls per micro-step."""
        return self.ppo_mini_batch_size * self.require_batches

    @property
    def step_required(self) -> int:
        """Samples consumed per weight version."""
        return self.required_samples * self.trigger_parameter_sync_step

    @property
    def max_required(self) -> int:
        """Samples that may be started within one version before pausing."""
        return int(self.required_samples * (self.staleness_threshold + 1) * self.trigger_parameter_sync_step)

    @property
    def max_queue_size(self) -> int:
        """MessageQueue size at which the rollouter pauses."""
        return self.max_required

    @property
    def total_train_steps(self) -> int:
        """Weight versions the run produces."""
        return int(self.total_rollout_steps / self.step_required)

    @classmethod
    def from_config(cls, config: Config) -> FlowLimits:
        at = config.async_training
        return cls(ppo_mini_batch_size=config.trainer.ppo_mini_batch_size, require_batches=at.require_batches,
                   trigger_parameter_sync_step=at.trigger_parameter_sync_step,
                   staleness_threshold=at.staleness_threshold,
                   total_rollout_steps=config.data.total_rollout_steps)

    def max_concurrent(self, active_replicas: int, concurrent_samples_per_replica: int, *,
                       standalone_replicas: int | None = None,
                       hybrid_concurrent_samples_per_replica: int | None = None) -> int:
        """Samples that may be generating at once; recompute on every replica change. The active
        replicas past the first `standalone_replicas` are hybrids, each holding
        `hybrid_concurrent_samples_per_replica` (None: the same as a standalone; the seed's formula)."""
        if active_replicas < 0:
            raise ValueError(f"active_replicas must be >= 0, got {active_replicas}")
        for name, value in (("concurrent_samples_per_replica", concurrent_samples_per_replica),
                            ("hybrid_concurrent_samples_per_replica", hybrid_concurrent_samples_per_replica)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        per_standalone = concurrent_samples_per_replica
        per_hybrid = hybrid_concurrent_samples_per_replica or per_standalone
        standalones = active_replicas
        if standalone_replicas is not None:
            standalones = min(active_replicas, standalone_replicas)
        capacity = standalones * per_standalone + (active_replicas - standalones) * per_hybrid
        return min(capacity, self.max_required)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResetReport:
    """What one ``StalenessTracker.reset`` measured for the version that just ended."""

    step_generated_samples: int
    """Samples queued during the version (``fully_async/rollouter/step_generated_samples``)."""
    completed_steps: int
    """``completed_steps`` after the reset."""
    staleness_samples: int
    """Staleness carried into the next version (in flight + queued)."""
    version_time_s: float
    """``now - step_start``."""
    active_time_s: float
    """``idle_start - step_start`` if the rollouter went idle in this version, else ``version_time_s``."""
    idle_ratio: float
    """Original formula: ``1 - active_time/version_time`` (only the last idle window counts)."""
    idle_time_s: float
    """Sum of every idle window in the version (fix for verl #6693), open window closed at now."""
    idle_ratio_all_windows: float
    """``idle_time_s / version_time_s`` (0 when the version took no time)."""


class StalenessTracker:
    """Staleness accounting of the rollouter, one instance per run.

    Call order per sample: ``on_submit`` when it is popped from the feed, then
    ``on_generated`` (it reached the MessageQueue) or ``on_dropped``.
    """

    def __init__(self, *, limits: FlowLimits, now_s: float) -> None:
        self.limits = limits
        self.staleness_samples = 0
        self.paused = False
        self.completed_steps = 1
        self.step_generated = 0
        self.total_generated = 0
        self.dropped = 0
        self.step_start_s = now_s
        self.idle_start_s: float | None = None
        """Start of the last idle window (kept across versions, as the original)."""
        self._idle_open_since_s: float | None = None
        self._idle_closed_s = 0.0
        self._idle_closed_total_s = 0.0

    # -- pause / resume ------------------------------------------------------

    def should_pause(self, queue_size: int) -> bool:
        """The pause condition (pure check; does not change ``paused``)."""
        if queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {queue_size}")
        return queue_size >= self.limits.max_queue_size or self.staleness_samples >= self.limits.max_required

    def check_pause(self, queue_size: int) -> bool:
        """Processor step 1: latch ``paused`` if already paused or the condition holds."""
        if self.paused or self.should_pause(queue_size):
            self.paused = True
        return self.paused

    def try_resume(self, queue_size: int) -> bool:
        """Monitor step: un-pause if paused and the condition no longer holds; True if resumed."""
        if self.paused and not self.should_pause(queue_size):
            self.paused = False
            return True
        return False

    # -- per-sample counters -------------------------------------------------

    def on_submit(self) -> None:
        """A sample was taken from the feed for generation."""
        self.staleness_samples += 1

    def on_generated(self, count: int = 1) -> None:
        """``count`` samples were written to the MessageQueue."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.total_generated += count
        self.step_generated += count

    def on_dropped(self, count: int = 1) -> None:
        """``count`` samples were dropped (stale / queue full); the caller records the reason."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.dropped += count

    # -- idle windows --------------------------------------------------------

    def on_idle_start(self, now_s: float) -> None:
        """The drain emptied while paused: generation capacity is idle from ``now_s``."""
        self.idle_start_s = now_s
        if self._idle_open_since_s is None:
            self._idle_open_since_s = now_s

    def on_idle_end(self, now_s: float) -> None:
        """Generation resumed (monitor un-pause or reset)."""
        if self._idle_open_since_s is not None:
            start_s = max(self._idle_open_since_s, self.step_start_s)
            self._idle_closed_s += max(0.0, now_s - start_s)
            self._idle_closed_total_s += max(0.0, now_s - self._idle_open_since_s)
            self._idle_open_since_s = None

    @property
    def idle_closed_total_s(self) -> float:
        """Seconds of the idle windows closed since this tracker began, all versions (what the status
        publishes; the per-version sum feeds `ResetReport.idle_time_s`)."""
        return self._idle_closed_total_s

    @property
    def idle_open_since_s(self) -> float | None:
        """When the idle window still open began (None: the rollouter is not idle)."""
        return self._idle_open_since_s

    # -- weight sync ---------------------------------------------------------

    def reset(self, *, num_active: int, queue_size: int, now_s: float) -> ResetReport:
        """Start a new weight version (``reset_staleness``).

        ``num_active`` is the number of samples generating right now (active
        tasks, not replicas); ``queue_size`` the samples queued and not yet
        taken by the trainer.
        """
        if num_active < 0 or queue_size < 0:
            raise ValueError(f"num_active and queue_size must be >= 0, got {num_active}, {queue_size}")
        self.paused = False
        self.staleness_samples = num_active + queue_size
        version_time_s = now_s - self.step_start_s
        if self.idle_start_s is not None and self.idle_start_s > self.step_start_s:
            active_time_s = self.idle_start_s - self.step_start_s
        else:
            active_time_s = version_time_s
        idle_ratio = 1.0 - active_time_s / version_time_s if version_time_s > 0 else 0.0
        self.on_idle_end(now_s)
        idle_time_s = self._idle_closed_s
        if self.step_generated > 0:
            self.completed_steps += 1
        report = ResetReport(
            step_generated_samples=self.step_generated,
            completed_steps=self.completed_steps,
            staleness_samples=self.staleness_samples,
            version_time_s=version_time_s,
            active_time_s=active_time_s,
            idle_ratio=idle_ratio,
            idle_time_s=idle_time_s,
            idle_ratio_all_windows=idle_time_s / version_time_s if version_time_s > 0 else 0.0,
        )
        self.step_generated = 0
        self._idle_closed_s = 0.0
        self.step_start_s = now_s
        return report

