"""The adaptive policy's pure arithmetic: the fluid queue over one sync cycle, and the moving statistics of
the model's measured error.

Where it sits: imported by `policies/adaptive_policy.py` only; no state, no context, no clock.
"""

from __future__ import annotations


def cycle_idle_s(*, queued: float, rate: float, required: int, micro_steps: int, train_s: float,
                 first_rate: float = 0.0) -> float:
    """Trainer seconds spent waiting over `micro_steps` micro-steps, starting with `queued` samples and
    producing `rate` samples/s throughout (fluid model); `first_rate`, when given, is the rate of a wait
    before the first micro-step (right after the sync, samples in flight finish at their own pace)."""
    idle = 0.0
    for index in range(micro_steps):
        if queued < required:
            wait_rate = first_rate if index == 0 and first_rate > 0 else rate
            if wait_rate <= 0:
                return float("inf")
            wait = (required - queued) / wait_rate
            idle += wait
            queued = required
        queued += rate * train_s - required
    return idle


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
