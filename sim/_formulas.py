"""Adapter: section-4 formulas used by the simulator.

Temporary local copy until ``core.metrics`` lands; then these names delegate
to it so the simulator and the services compute metrics with the same code.
"""

from __future__ import annotations


def train_utilization(compute_s: float, allocated_s: float) -> float:
    """4.1: sum(compute) / sum(alloc) over the cycle (0 when nothing was allocated)."""
    return compute_s / allocated_s if allocated_s > 0 else 0.0


def hybrid_rollout_fraction(wait_s: float, step_s: float) -> float:
    """4.3: x = clip(sum(wait_for_enough_samples) / sum(step), 0, 1)."""
    return min(1.0, max(0.0, wait_s / step_s)) if step_s > 0 else 0.0


def cluster_utilization(*, x: float, trainer_gpus: int, standalone_gpus: int, train_util: float,
                        rollout_util: float) -> float:
    """4.3: ((1-x) a U_train + (x a + b) U_rollout) / (a + b)."""
    a, b = trainer_gpus, standalone_gpus
    return ((1 - x) * a * train_util + (x * a + b) * rollout_util) / (a + b)
