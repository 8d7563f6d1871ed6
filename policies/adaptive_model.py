"""The adaptive policy's pure arithmetic: the fluid queue over one sync cycle, the moving statistics of
the model's measured error, and the corrections read from them per decision kind and queue level.

Where it sits: imported by `policies/adaptive_policy.py` only; no state, no context, no clock.
"""

from __future__ import annotations

from typing import NamedTuple


class CycleQueue(NamedTuple):
    """One sync cycle in the fluid model."""

    idle_s: float
    """Trainer seconds spent waiting for samples."""
    waited_samples: float
    """Samples the trainer waited for (produced while it idled)."""
    end_samples: float
    """Samples left queued when the cycle's last micro-step is done (carried into the next cycle)."""


def cycle_queue(*, queued: float, rate: float, required: int, micro_steps: int, train_s: float,
                first_rate: float = 0.0) -> CycleQueue:
    """The cycle of `micro_steps` micro-steps starting with `queued` samples and producing `rate`
    samples/s throughout (fluid model); `first_rate`, when given, is the rate of a wait before the first
    micro-step (right after the sync, samples in flight finish at their own pace)."""
    idle = waited = 0.0
    for index in range(micro_steps):
        if queued < required:
            wait_rate = first_rate if index == 0 and first_rate > 0 else rate
            if wait_rate <= 0:
                return CycleQueue(float("inf"), float("inf"), 0.0)
            idle += (required - queued) / wait_rate
            waited += required - queued
            queued = required
        queued += rate * train_s - required
    return CycleQueue(idle, waited, queued)


def carry_value_s(*, end_samples: float, static_end_samples: float, room: float, static_waited: float,
                  window_rate: float) -> float:
    """Seconds of the next cycle's wait that the samples a switching cycle leaves queued beyond what a
    cycle kept asleep would leave save: counted up to `room` (the carry-over limit less what the
    standalones keep in flight: a version's carry-over counts queued and running samples alike, so a
    queue filled past it only stops the rollouter) and up to the samples a cycle kept asleep waits for
    (`static_waited`: beyond them the next cycle would not wait anyway), each worth what the next hybrid
    window takes to produce it (`window_rate`: the conservative price; a cycle kept asleep pays more)."""
    if window_rate <= 0:
        return 0.0
    extra = min(end_samples, room) - min(static_end_samples, room)
    return min(max(0.0, extra), static_waited) / window_rate


def in_flight_credit_rate(*, pooled: float, fill_rate: float, serving_rate: float, load_cost: float) -> float:
    """Samples/s of a hybrid window's work still in flight at its deactivation, finished on the standalones
    after it. `pooled` (P_s + P_h) is what the model says the replicas produce while the hybrids serve and
    `fill_rate` what the queue measured gaining: their difference is credited whole (as before session 28).
    `serving_rate` is every serving replica at the per-replica rate pooled over whole cycles: work is
    conserved, so what it holds beyond `pooled` is progress the hybrids made on samples the standalones
    would have run anyway (the rollouter at its staleness cap), handed over as extra load. An engine whose
    step grows with its load (`load_cost` L, measured) finishes extra load at its marginal rate, 1 / (1 + L)
    of its average (step a + b n: d(n / step) / dn = a / step^2), so that part is credited at that rate."""
    beyond = max(0.0, serving_rate - pooled) / (1.0 + max(0.0, load_cost))
    return max(0.0, pooled - fill_rate) + beyond


def queue_level(queued: int, *, required: int, levels: int) -> int:
    """How many micro-steps a queue of `queued` samples can feed, capped at `levels` - 1."""
    return min(levels - 1, max(0, queued) // required)


def pool_wait(pooled: list[float], *, samples: int, seconds: float, weight: float) -> list[float]:
    """[samples, seconds] decayed by `weight` with one more wait added (unchanged for an empty wait)."""
    if samples <= 0 or seconds <= 0:
        return pooled
    return [(1 - weight) * pooled[0] + samples, (1 - weight) * pooled[1] + seconds]


def pooled_rate(pooled: list[float], *, min_samples: int) -> float:
    """Samples/s of pooled waits, weighted by samples (a wait for one sample is mostly its collection); 0
    until they hold `min_samples`."""
    samples, seconds = pooled
    return samples / seconds if samples >= min_samples and seconds > 0 else 0.0


def first_or_ewma(average: float, value: float, *, weight: float) -> float:
    """`value` while `average` is negative (nothing measured yet), else one exponentially weighted step."""
    return value if average < 0 else average + weight * (value - average)


def moving_mean_var(mean: float, variance: float, value: float, *, weight: float) -> tuple[float, float]:
    """One step of an exponentially weighted mean and variance (West's update): the newest value weighs
    `weight`, and the variance is that of the values around the moving mean."""
    step = weight * (value - mean)
    return mean + step, (1 - weight) * (variance + (value - mean) * step)


def standard_error(variance: float, *, weight: float) -> float:
    """Standard error of an exponentially weighted mean of values with `variance` (effective sample size
    (2 - weight) / weight)."""
    return (variance * weight / (2 - weight)) ** 0.5


def clip_outlier(value: float, mean: float, variance: float, *, sigmas: float) -> float:
    """`value` moved to within `sigmas` standard deviations of `mean` (unchanged while variance is 0)."""
    if variance <= 0:
        return value
    bound = sigmas * variance ** 0.5
    return min(mean + bound, max(mean - bound, value))


def robust_moving_mean_var(mean: float, variance: float, value: float, *, weight: float,
                           sigmas: float) -> tuple[float, float]:
    """`moving_mean_var` whose mean takes an outlier clipped to `sigmas` standard deviations (one cycle
    waiting for a very long response must not set the mean for many), and whose variance takes it whole."""
    new_mean, _ = moving_mean_var(mean, variance, clip_outlier(value, mean, variance, sigmas=sigmas),
                                  weight=weight)
    _, new_variance = moving_mean_var(mean, variance, value, weight=weight)
    return new_mean, new_variance


def rescaled(values: dict[str, float], factor: float) -> dict[str, float]:
    """Every value times `factor`."""
    return {key: value * factor for key, value in values.items()}


def level_correction(bias_by_level: dict[str, float], *, kind: str, level: int) -> float:
    """The measured error for a decision of `kind` ("stay" / "activate") at queue `level`, from the moving
    averages keyed "kind@level". A level not measured yet: for a stay 0 (the uncorrected model): a stay's
    error does not carry over to another level, since a stay right after a switch (a full queue, the
    rollouter held at its staleness limit) idles more than the model says, a stay at an empty queue less.
    For an activation, the least error measured at the other levels, floored at 0: a switch that cost more
    than the model says wherever it was tried (a hybrid window shorter than a fresh replica's first samples
    take, at a high concurrency) costs at least that much more at a level it has not been tried at; one that
    measured as predicted anywhere leaves the model as it is."""
    own = bias_by_level.get(f"{kind}@{level}")
    if own is not None or kind == "stay":
        return own or 0.0
    others = [bias for key, bias in bias_by_level.items() if key.startswith("activate@")]
    return max(0.0, min(others)) if others else 0.0


def applied_corrections(bias_by_level: dict[str, float], *, level: int,
                        static_measured: bool) -> dict[str, float]:
    """The stay and activate corrections a decision at queue `level` applies (`level_correction`). Before
    any static cycle was measured, a negative activation correction (switches idled less than predicted)
    is not applied: the likely cause is rates the model has too low (production held back by the
    staleness limit reads as slow replicas), which makes its static prediction just as pessimistic, so
    crediting the error to the switch alone would argue for switching on a comparison never checked."""
    corrections = {kind: level_correction(bias_by_level, kind=kind, level=level)
                   for kind in ("stay", "activate")}
    if not static_measured:
        corrections["activate"] = max(0.0, corrections["activate"])
    return corrections


def corrections_standard_error(bias_by_level: dict[str, float], var_by_level: dict[str, float],
                               count_by_level: dict[str, int], *, level: int, weight: float) -> float:
    """Standard error of the stay and activate corrections compared at `level` (0 where unmeasured). A
    correction measured once has no variance yet: its own size stands in for the spread (one cycle that erred
    by e says the error is e give or take e), so a single far-off cycle cannot alone turn a small uncorrected
    loss into a switch. A key with no count (a state saved before counts were kept) uses its variance."""
    variance = 0.0
    for kind in ("stay", "activate"):
        key = f"{kind}@{level}"
        if key not in bias_by_level:
            continue
        once = count_by_level.get(key, 2) == 1
        variance += bias_by_level[key] ** 2 if once else var_by_level.get(key, 0.0)
    return standard_error(variance, weight=weight)
