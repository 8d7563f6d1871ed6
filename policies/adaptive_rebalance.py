"""The adaptive policy's rebalance choice, by measurement: rebalance at an activation or skip it.

Where it sits: imported by `policies/adaptive_policy.py` only; pure functions over the policy's plain-data
statistics (kept in its `state_dict`), no context, no clock. A rebalance aborts every serving replica
(their in-flight work is re-prefilled) to spread it onto the empty hybrids; whether that fills the queue
faster depends on how much a smaller batch speeds decoding. Each choice is tried REBALANCE_TRIALS times,
then the one whose hybrid windows filled the queue faster is kept, the other re-tried now and then.
"""

from __future__ import annotations

REBALANCE_TRIALS = 2
"""Activations tried with and without the rebalance before the measured better one is kept."""
REBALANCE_RETRY_EVERY = 8
"""After the trials, every this-many activations re-measure the other choice (workloads drift)."""
REBALANCE_MEMORY = 10
"""Windows a choice's mean fill rate remembers."""
CHOICES = ("skip", "rebalance")


def new_fill_rates() -> dict[str, list[float]]:
    """Per choice: [mean of the hybrid windows' measured fill rates (samples/s), windows measured]."""
    return {choice: [0.0, 0.0] for choice in CHOICES}


def choose_rebalance(fill_rates: dict[str, list[float]], decisions: int) -> tuple[str, str]:
    """(choice, why) for the `decisions`-th rebalance decision of the run (counted from 1)."""
    untried = [choice for choice in CHOICES if fill_rates[choice][1] < REBALANCE_TRIALS]
    if untried:
        return untried[0], "trying each choice"
    means = {choice: stats[0] for choice, stats in fill_rates.items()}
    best = max(means, key=lambda c: (means[c], c == "skip"))
    if decisions % REBALANCE_RETRY_EVERY == 0:
        return ("rebalance" if best == "skip" else "skip"), "re-measuring the other choice"
    return best, "faster fill measured"


def credit_fill_rate(fill_rates: dict[str, list[float]], choice: str, rate: float) -> None:
    """Fold one window's measured fill rate into `choice`'s mean of its last ~REBALANCE_MEMORY windows
    (one noisy window must not flip the choice)."""
    stats = fill_rates[choice]
    stats[1] += 1
    stats[0] += (rate - stats[0]) / min(stats[1], REBALANCE_MEMORY)
