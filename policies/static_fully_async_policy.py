"""Built-in "static_fully_async" policy: plain fully-async, hybrids never generate.

Where it sits: registered under "static_fully_async"; the baseline for
comparisons (trainer GPUs always 100% training), and the colocated fallback
the seed promises. Pure: everything comes from the context.
"""

from __future__ import annotations

from policies.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy


@register_policy("static_fully_async")
class StaticFullyAsyncPolicy(DynamicSchedulePolicyBase):
    """With standalone replicas: deactivate if active, wait for nothing, never activate.

    Colocated mode (only_hybrid, no standalone replicas): activate at every sync
    and deactivate once step_required_samples are queued, i.e. classic colocated
    "generate a cycle's samples, then train it".

    Fixed versus the original: its colocated fallback never activated, so with
    no standalone replicas the rollouter had zero capacity and training stalled
    forever. Here only_hybrid activates at every sync (ratio pinned at 1.0).
    deactivate_ratio is otherwise unused; it is kept so describe() reports it.
    """

    def __init__(self, deactivate_ratio: float = 0.0, only_hybrid: bool = False):
        super().__init__(deactivate_ratio, only_hybrid)

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool,
                          ctx: DynamicScheduleContext) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return ctx.step_required_samples if self.only_hybrid else 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self.only_hybrid
