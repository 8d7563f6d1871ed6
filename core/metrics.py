"""Metric formulas of the seed's section 4 and the reference's section 3, as pure functions.

Where it sits: services and the simulator record raw events (timings per
micro-step, the rollouter's (t, active, capacity) history, trajectory weight
versions) and call these functions; they never read a clock themselves, so
the same numbers come out of a live run and a virtual-clock simulation.
`CycleAggregator` reduces one sync cycle's per-micro-step metrics with the
original's rules and adds the derived ratios under the seed's metric names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.schema import Sample

TRAIN_COMPUTE_KEYS = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
"""timing_raw keys counted as training compute (the ref timer's key is "ref", not "RefPolicy")."""

# Metric names (the seed's); the one home for every name a service or the simulator writes.
TRAIN_UTIL = "dynamic_resource/train_resource_utilization"
ROLLOUT_UTIL = "dynamic_resource/rollout_resource_utilization"
CLUSTER_UTIL = "dynamic_resource/resource_utilization"
TRAIN_COMPUTE = "dynamic_resource/train_compute_time_s"
TRAIN_ALLOC = "dynamic_resource/train_allocated_time_s"
MQ_SIZE = "dynamic_resource/mq_size"
TRAINER_IDLE = "fully_async/trainer/idle_ratio"
WAIT_ENOUGH = "timing_s/wait_for_enough_samples"
STEP_TIME = "timing_s/step"
GEN_TIME = "timing_s/gen"

# The rollouter's report at each reset_staleness (one weight version).
STEP_GENERATED = "fully_async/rollouter/step_generated_samples"
ROLLOUTER_IDLE = "fully_async/rollouter/idle_ratio"
ROLLOUTER_VERSION_TIME = "fully_async/rollouter/version_time_s"
ROLLOUTER_ACTIVE_TIME = "fully_async/rollouter/active_time_s"
ROLLOUTER_IDLE_ALL_WINDOWS = "fully_async/rollouter/idle_ratio_all_windows"
STALENESS_SAMPLES = "fully_async/count/staleness_samples"
TOTAL_GENERATED = "fully_async/count/total_generated_samples"
DROPPED_STALE = "fully_async/count/dropped_stale_samples"
ACTIVE_TASKS = "fully_async/monitor/active_tasks_size"
MQ_QUEUE_SIZE = "fully_async/monitor/queue/mq_queue_size"
MAX_CONCURRENT = "fully_async/static/max_concurrent_samples"
MAX_REQUIRED = "fully_async/static/max_required_samples"
REQUIRED_SAMPLES = "fully_async/static/required_samples"
MAX_QUEUE_SIZE = "fully_async/static/max_queue_size"
STALENESS_THRESHOLD = "fully_async/static/staleness_threshold"
# Beyond the seed: how old the trained data is (the planner's `lag v.`, sim.result.SimResult.mean_sample_lag).
SAMPLE_LAG_MEAN = "dynsched/trainer/sample_lag_versions_mean"
# Beyond the seed: the engines' step against their load as the controller fitted it (core/measure.py).
DECODE_LOAD_COST = "dynsched/controller/decode_load_cost"

LAST_KEYS = frozenset(
    {
        TOTAL_GENERATED,
        "fully_async/count/stale_samples_processed",
        "fully_async/count/stale_trajectory_processed",
        "fully_async/count/current_param_version",
        DROPPED_STALE,
        "training/global_step",
        MQ_SIZE,
    }
)
"""Keys reduced to the cycle's last value (cumulative counters and snapshots)."""
SUM_KEYS = frozenset({TRAIN_COMPUTE, TRAIN_ALLOC})
"""Keys summed over the cycle so ratios are computed once from totals."""


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def train_compute_time_s(timing_raw: Mapping[str, float]) -> float:
    """Training compute of one micro-step: sum of TRAIN_COMPUTE_KEYS, missing keys counting 0."""
    return float(sum(timing_raw.get(key, 0.0) for key in TRAIN_COMPUTE_KEYS))


def train_resource_utilization(compute_s: Iterable[float], allocated_s: Iterable[float]) -> float:
    """U_train = Σcompute / Σalloc over a cycle's micro-steps (ratio of totals); 0 if Σalloc is 0."""
    return _ratio(sum(compute_s), sum(allocated_s))


def rollout_resource_utilization(history: Sequence[tuple[float, int, int]], now: float) -> float:
    """U_rollout = Σ dt·min(cap, active) / Σ dt·cap over the history closed at `now`.

    `history` is (t, active, cap) points in time order; each holds until the next
    point (the last until `now`). Intervals with cap <= 0 or dt <= 0 are skipped;
    0.0 if nothing is left to integrate.
    """
    used = weight = 0.0
    for k, (t_k, active_k, cap_k) in enumerate(history):
        t_next = history[k + 1][0] if k + 1 < len(history) else now
        dt = t_next - t_k
        if cap_k <= 0 or dt <= 0:
            continue
        used += dt * min(cap_k, active_k)
        weight += dt * cap_k
    return _ratio(used, weight)


class UtilizationHistory:
    """The rollouter's event-driven (t, active, cap) record for one step window.

    Seeded at init with capacity 0 (unknown yet); `set_initial_capacity` patches
    those leading zero-capacity points once, when the real capacity is known.
    `close(now)` returns U_rollout for the window and re-seeds the next window
    at `now` with the current active count and capacity.
    """

    def __init__(self, *, t0: float, active: int = 0, cap: int = 0):
        self.points: list[tuple[float, int, int]] = [(t0, active, cap)]
        self._patched = cap > 0

    def record(self, t: float, active: int, cap: int) -> None:
        """Append a point: call on every active-set change and every capacity change."""
        if t < self.points[-1][0]:
            raise ValueError(f"history must be in time order: {t} < {self.points[-1][0]}")
        self.points.append((t, active, cap))

    def set_initial_capacity(self, cap: int) -> None:
        """Replace the capacity of leading zero-capacity points with `cap` (first call only)."""
        if self._patched:
            return
        self._patched = True
        for k, (t, active, old_cap) in enumerate(self.points):
            if old_cap != 0:
                break
            self.points[k] = (t, active, cap)

    def close(self, now: float) -> float:
        """U_rollout of the window ending at `now`; the next window starts at `now`."""
        utilization = rollout_resource_utilization(self.points, now)
        _, active, cap = self.points[-1]
        self.points = [(now, active, cap)]
        return utilization


def hybrid_rollout_fraction(wait_s: float, step_s: float) -> float:
    """x = clip(Σwait_for_enough_samples / Σstep, 0, 1); 0 when there is no step time."""
    return min(1.0, max(0.0, _ratio(wait_s, step_s)))


def cluster_resource_utilization(
    u_train: float,
    u_rollout: float,
    wait_s: float,
    step_s: float,
    *,
    num_trainer_gpus: int,
    num_standalone_gpus: int,
) -> float:
    """U = ((1-x)·a·U_train + (x·a + b)·U_rollout) / (a + b), x = hybrid_rollout_fraction(wait, step).

    a = trainer GPUs (the hybrids' GPUs), b = standalone GPUs; 0 if a + b is 0.
    Assumes the policy deactivates whenever hybrids are active (seed caveat).
    """
    a, b = num_trainer_gpus, num_standalone_gpus
    x = hybrid_rollout_fraction(wait_s, step_s)
    return _ratio((1 - x) * a * u_train + (x * a + b) * u_rollout, a + b)


def trainer_idle_ratio(gen_s: Iterable[float], step_s: Iterable[float]) -> float:
    """Σtiming_s/gen / Σtiming_s/step: share of the trainer's step spent waiting for samples."""
    return _ratio(sum(gen_s), sum(step_s))


def partial_rollout_stats(versions: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Partial-rollout counts over trajectories given as (min_version, max_version) pairs."""
    spans = [abs(hi - lo) for lo, hi in versions]
    num_partial = sum(1 for span in spans if span != 0)
    return {
        "fully_async/partial/total_partial_num": float(num_partial),
        "fully_async/partial/partial_ratio": _ratio(num_partial, len(spans)),
        "fully_async/partial/max_partial_span": float(max(spans, default=0)),
    }


def stale_trajectory_count(current_version: int, max_versions: Iterable[int]) -> int:
    """Trajectories whose newest generating version lags the trained version by >= 1."""
    return sum(1 for max_version in max_versions if current_version - max_version >= 1)


def sample_lag_mean(current_version: int, min_versions: Sequence[int]) -> float:
    """Mean over samples of the trained version minus the version of the sample's first tokens
    (`Sample.min_version`); 0 for no samples."""
    return sum(current_version - v for v in min_versions) / len(min_versions) if min_versions else 0.0


def trained_batch_metrics(version: int, samples: Sequence[Sample], *,
                          stale_trajectories: int) -> dict[str, float]:
    """The trainer's per-micro-step metrics of the batch it trains at `version`: partial-rollout counts,
    processing-time percentiles, the run's stale trajectories so far, the samples' lag, reward, lengths."""
    trajectories = [t for s in samples for t in s.trajectories]
    rewards = [t.reward for t in trajectories]
    tokens = sum(len(t.response_token_ids) for t in trajectories)
    return {
        **partial_rollout_stats([(t.min_version, t.max_version) for t in trajectories]),
        **processing_time_stats(t.generation_time_s for t in trajectories),
        "fully_async/count/stale_trajectory_processed": float(stale_trajectories),
        SAMPLE_LAG_MEAN: sample_lag_mean(version, [s.min_version for s in samples if s.trajectories]),
        "training/reward_mean": sum(rewards) / max(1, len(rewards)),
        "response_length/mean": tokens / max(1, len(trajectories)),
        "perf/total_num_tokens": float(tokens),
    }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values."""
    position = (len(sorted_values) - 1) * q / 100.0
    lower, upper = math.floor(position), math.ceil(position)
    fraction = position - lower
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * fraction


def processing_time_stats(times_s: Iterable[float]) -> dict[str, float]:
    """Per-trajectory generation time: avg, max, min, tp50, tp95, tp99 ({} when empty)."""
    values = sorted(times_s)
    if not values:
        return {}
    prefix = "fully_async/processing_time/"
    return {
        prefix + "avg": sum(values) / len(values),
        prefix + "max": values[-1],
        prefix + "min": values[0],
        prefix + "tp50": _percentile(values, 50),
        prefix + "tp95": _percentile(values, 95),
        prefix + "tp99": _percentile(values, 99),
    }


def reduction_for(key: str) -> str:
    """How a key is reduced over a cycle: "last", "sum", "mean", "max" or "min" (upstream's rules).

    Fixed keys first (LAST_KEYS, SUM_KEYS), then by name in this order:
    contains "timing_s/" -> sum; "mean"/"avg" -> mean; "max" -> max; "min" -> min;
    "sum"/"total" -> sum; otherwise mean.
    """
    if key in LAST_KEYS:
        return "last"
    if key in SUM_KEYS or "timing_s/" in key:
        return "sum"
    for needles, rule in ((("mean", "avg"), "mean"), (("max",), "max"), (("min",), "min"),
                          (("sum", "total"), "sum")):
        if any(needle in key for needle in needles):
            return rule
    return "mean"


def _reduce(rule: str, values: list[float]) -> float:
    if rule == "last":
        return values[-1]
    if rule == "sum":
        return sum(values)
    if rule == "max":
        return max(values)
    if rule == "min":
        return min(values)
    return sum(values) / len(values)


class CycleAggregator:
    """Collects per-micro-step metric dicts and reduces them once per sync cycle."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}

    def add(self, metrics: Mapping[str, Any]) -> None:
        """Record one micro-step's (or one rollouter report's) numeric metrics; others are ignored."""
        for key, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._values.setdefault(key, []).append(float(value))

    def __len__(self) -> int:
        return len(self._values)

    def reduce(
        self,
        *,
        rollout_utilization: float | None = None,
        num_trainer_gpus: int = 0,
        num_standalone_gpus: int = 0,
    ) -> dict[str, float]:
        """The cycle's metrics, plus derived ratios computed once from the cycle's totals.

        Adds train_resource_utilization when compute/allocated times were recorded,
        fully_async/trainer/idle_ratio when gen/step timings were, and, given the
        rollouter's `rollout_utilization` and the GPU counts, rollout and cluster
        (resource_utilization) utilization.
        """
        out = {key: _reduce(reduction_for(key), values) for key, values in self._values.items()}
        if TRAIN_ALLOC in out:
            out[TRAIN_UTIL] = _ratio(out.get(TRAIN_COMPUTE, 0.0), out[TRAIN_ALLOC])
        if STEP_TIME in out:
            out[TRAINER_IDLE] = trainer_idle_ratio([out.get(GEN_TIME, 0.0)], [out[STEP_TIME]])
        if rollout_utilization is not None and TRAIN_UTIL in out:
            out[ROLLOUT_UTIL] = rollout_utilization
            out[CLUSTER_UTIL] = cluster_resource_utilization(
                out[TRAIN_UTIL],
                rollout_utilization,
                out.get(WAIT_ENOUGH, 0.0),
                out.get(STEP_TIME, 0.0),
                num_trainer_gpus=num_trainer_gpus,
                num_standalone_gpus=num_standalone_gpus,
            )
        return out

    def reset(self) -> None:
        """Start a new cycle."""
        self._values.clear()
