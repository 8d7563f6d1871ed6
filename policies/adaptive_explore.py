"""The adaptive policy's exploring switch: when to measure a switch its prior alone keeps asleep.

Where it sits: imported by `policies/adaptive_policy.py` only. Pure: it reads the context, the switch
parts measured so far (negative: not yet) and the decision's own numbers. Without a blind start-up switch
(the standalones held max_required) an unmeasured switch part counts as one micro-step of training, a prior
that can keep the hybrids asleep for the whole run although the switch would measure far cheaper.
"""

from __future__ import annotations

from policies.adaptive_cycle import best_wait, queued_after_sync, switch_cost_s
from policies.base import DynamicScheduleContext

EXPLORE_RISK = 3.0
"""A switch measured can cost several times its prior (the robustness grids: 2-4 times); exploring is
allowed only where a switch this many times the prior would cost at most EXPLORE_RUN_SHARE of the run left."""
EXPLORE_RUN_SHARE = 0.01
"""The share of the run left that one exploring switch may risk: the robustness target (1% over static)."""
EXPLORE_PRIOR_FRACTION = 0.5
"""The unmeasured part's prior is trusted within this factor: exploring is considered only where a switch
this much cheaper than the prior would pay (a switch can cost far more than its prior: it may never pay)."""
EXPLORE_AFTER = 2
"""Cycles in a row that must find the unmeasured switch worth measuring (one cycle's idle can spike)."""


def exploring_wait(ctx: DynamicScheduleContext, *, activate_s: float, deactivate_s: float, static_idle: float,
                   activate_bias: float, min_gain_s: float) -> int:
    """The X of a switch worth measuring (0: none, or every part measured): with the unmeasured part at
    EXPLORE_PRIOR_FRACTION of its prior the predicted gain beats `min_gain_s`, and a switch EXPLORE_RISK
    times the prior would cost at most EXPLORE_RUN_SHARE of the run left (its static cycles as predicted:
    `ctx.total_samples` gives how many)."""
    if min(activate_s, deactivate_s) >= 0 or ctx.total_samples <= 0:
        return 0
    cycles_left = (ctx.total_samples - ctx.expected_samples) / ctx.step_required_samples
    run_left_s = cycles_left * (ctx.trigger_parameter_sync_step * ctx.trainer_s_per_micro_step
                                + max(0.0, static_idle))
    prior_switch_s = switch_cost_s(activate_s=activate_s, deactivate_s=deactivate_s,
                                   prior_s=ctx.trainer_s_per_micro_step)
    if EXPLORE_RISK * prior_switch_s > EXPLORE_RUN_SHARE * run_left_s:
        return 0
    low_s = switch_cost_s(activate_s=activate_s, deactivate_s=deactivate_s,
                          prior_s=EXPLORE_PRIOR_FRACTION * ctx.trainer_s_per_micro_step)
    wait, _, dynamic_idle, _ = best_wait(ctx, switch_s=low_s)
    gain = max(0.0, static_idle) - max(low_s, dynamic_idle + activate_bias)
    return wait if gain > min_gain_s and wait > queued_after_sync(ctx) else 0
