"""Built-in "default" policy: adaptive deactivate_ratio plus a cost/benefit activation gate.

Where it sits: registered under "default" and chosen by config
(`dynamic_schedule_policy`); the controller core calls it. Pure: everything
comes from the DynamicScheduleContext.

Logic and constants are the original's (reference section 2.3); two known
defects are fixed, see the class docstring.
"""

from __future__ import annotations

from typing import Any

from policies.base import DynamicScheduleContext, register_policy
from policies.fixed_ratio_policy import FixedRatioDynamicSchedulePolicy

DEFAULT_SWITCH_COST_S = 10.0
"""Switch cost assumed before any activate+deactivate overhead was measured."""
SWITCH_OVERHEAD_WINDOW_SIZE = 3
"""switch_cost is the mean of the last this-many measured overheads."""
DEACTIVATE_RATIO_INCREASE_MIN = 0.02
DEACTIVATE_RATIO_INCREASE_MAX = 0.1
"""The ratio increase Σwait_samples / step_required_samples is clipped to [MIN, MAX]."""
DEACTIVATE_RATIO_DECREASE_STEP = 0.02
"""Ratio decrease after a cycle with no real wait."""
INITIAL_PER_SAMPLE_TIME_S = 1000.0
"""Deliberately pessimistic per-sample time before any real signal: biases toward activating."""


@register_policy("default")
class DefaultDynamicSchedulePolicy(FixedRatioDynamicSchedulePolicy):
    """Deactivate whenever hybrids are active; adapt the ratio; activate only when it pays.

    should_deactivate, deactivate_wait_samples and deactivate_gap are fixed_ratio's (inherited);
    this class adds the cost gate and the adaptation. The whole behaviour:

    - should_deactivate: is_hybrid_active.
    - deactivate_wait_samples: int(step_required_samples x ratio).
    - should_activate_after_step: gap = ratio x step_required - (generated - expected);
      activate iff gap > 0 and gap x per_sample_time > switch_cost, where switch_cost is
      the mean of the last <= 3 measured (activate + deactivate) overheads (10 s if none)
      and per_sample_time = Σwait_times / Σwait_samples, refreshed only when a gap exists
      and both sums are > 0 (starts at 1000 s).
    - update_after_step (skipped when global_steps <= 0, the initial sync, or only_hybrid):
      record the cycle's overhead if > 0; if any sample was really waited for,
      ratio += clip(Σwait_samples / step_required, 0.02, 0.1), else ratio -= 0.02.
    - only_hybrid (colocated): ratio fixed at 1.0, always activate, no adaptation.

    Fixed versus the original:
    - the ratio is clamped to [0, 1]; the original had no lower bound and could
      drift below 0 after many wait-free cycles.
    - the initial ratio is validated to lie in [0, 1] (ValueError otherwise).
    """

    def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False):
        super().__init__(deactivate_ratio, only_hybrid)
        self.recent_switch_overheads_s: list[float] = []
        self.per_sample_time_s: float = INITIAL_PER_SAMPLE_TIME_S

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        if self.only_hybrid:
            return True
        gap = self.deactivate_gap(ctx)
        if gap <= 0:
            return False
        per_sample_time_s = self._refresh_per_sample_time(ctx)
        return gap * per_sample_time_s - self.switch_cost_s() > 0

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        if global_steps <= 0 or self.only_hybrid:
            return
        switch_overhead_s = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if switch_overhead_s > 0:
            self.recent_switch_overheads_s.append(switch_overhead_s)
            # Only the window is ever read; keep persisted state bounded.
            del self.recent_switch_overheads_s[:-SWITCH_OVERHEAD_WINDOW_SIZE]
        total_wait_samples = sum(ctx.step_wait_samples)
        if total_wait_samples > 0:
            raw_increase = total_wait_samples / ctx.step_required_samples
            delta = min(DEACTIVATE_RATIO_INCREASE_MAX, max(DEACTIVATE_RATIO_INCREASE_MIN, raw_increase))
        else:
            delta = -DEACTIVATE_RATIO_DECREASE_STEP
        self.deactivate_ratio = min(1.0, max(0.0, self.deactivate_ratio + delta))

    # ---- helpers (pure) ----

    def switch_cost_s(self) -> float:
        """Mean of the last SWITCH_OVERHEAD_WINDOW_SIZE measured overheads, else DEFAULT_SWITCH_COST_S."""
        recent = self.recent_switch_overheads_s[-SWITCH_OVERHEAD_WINDOW_SIZE:]
        return sum(recent) / len(recent) if recent else DEFAULT_SWITCH_COST_S

    def _refresh_per_sample_time(self, ctx: DynamicScheduleContext) -> float:
        total_wait_s = sum(ctx.step_wait_times)
        total_wait_samples = sum(ctx.step_wait_samples)
        if total_wait_s > 0 and total_wait_samples > 0:
            self.per_sample_time_s = total_wait_s / total_wait_samples
        return self.per_sample_time_s

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["switch_cost_s"] = self.switch_cost_s()
        return info
