"""Built-in "fixed_ratio" policy: the default policy without adaptation or cost gate.

Where it sits: registered under "fixed_ratio" (imported by `policies/__init__.py`,
so it is available by default, unlike the original where the import was
missing); used for fixed-ratio ablations. Pure: everything comes from the context.
The "default" policy extends this one (same deactivation and gap; adds
adaptation and a cost gate), so the shared rules have one implementation.
"""

from __future__ import annotations

from policies.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy


@register_policy("fixed_ratio")
class FixedRatioDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """Deactivate whenever hybrids are active; the ratio never changes.

    - should_deactivate: is_hybrid_active.
    - deactivate_wait_samples: int(step_required_samples x ratio).
    - should_activate_after_step: generated - expected < ratio x step_required (a pure gap
      check, no cost/benefit gate); always True when only_hybrid.
    - update_after_step: no-op.

    Fixed versus the original: registered by default; the ratio is validated to
    lie in [0, 1]; only_hybrid pins it at 1.0 (as the original did).
    """

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool,
                          ctx: DynamicScheduleContext) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return int(ctx.step_required_samples * self.deactivate_ratio)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self.only_hybrid or self.deactivate_gap(ctx) > 0

    def deactivate_gap(self, ctx: DynamicScheduleContext) -> float:
        """Samples still missing to reach the deactivate threshold: ratio x step_required - surplus."""
        surplus = ctx.total_generated_samples - ctx.expected_samples
        return self.deactivate_ratio * ctx.step_required_samples - surplus
