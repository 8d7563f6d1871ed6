"""The adaptive policy's fluid model of one sync cycle, read from the controller's context.

Where it sits: imported by `policies/adaptive_policy.py` only. Pure: each function reads the context and
the switch cost it is given (the policy's measurement or a prior), nothing else; the arithmetic of the
queue is `policies/adaptive_model.py`.
"""

from __future__ import annotations

from policies.adaptive_model import cycle_idle_s, in_flight_credit_rate
from policies.base import DynamicScheduleContext


def rates(ctx: DynamicScheduleContext) -> tuple[float, float]:
    """(P_s, P_h) in samples/s from the per-replica rate pooled over whole cycles (hybrid work left
    unfinished at a deactivation completes on a standalone, so a window's rate under-counts it);
    before a cycle closed, the standalones' window rate; P_h what the hybrids would add to it."""
    per_replica = ctx.samples_per_replica_s or ctx.standalone_samples_per_replica_s
    standalone_rate = per_replica * ctx.num_standalone_replicas
    return standalone_rate, standalone_rate * ctx.hybrid_production_gain


def static_rate(ctx: DynamicScheduleContext, *, pooled: float) -> float:
    """The standalones' rate for the prediction of a cycle kept asleep: `pooled` (P_s), raised to their
    per-replica rate in steady cycles kept asleep (`static_samples_per_replica_s`) where that is higher.
    The hybrids' replica-seconds dilute the pooled rate where they add less than a standalone would; a
    steady static cycle slower than the pooled rate is a version waiting for its longest samples, which
    the pooled rate already averages in."""
    return max(pooled, ctx.static_samples_per_replica_s * ctx.num_standalone_replicas)


def switch_cost_s(*, activate_s: float, deactivate_s: float, prior_s: float) -> float:
    """Activation + deactivation (+ the trainer's offload/onload) as measured; a part not measured yet
    (negative) counts `prior_s`."""
    return (activate_s if activate_s >= 0 else prior_s) + (deactivate_s if deactivate_s >= 0 else prior_s)


def best_wait(ctx: DynamicScheduleContext, *, switch_s: float) -> tuple[int, float]:
    """(X, dynamic_idle(X)) minimising the predicted idle over X in [required, step_required] for a
    switch costing `switch_s`."""
    best = (ctx.required_samples, float("inf"))
    for wait in range(ctx.required_samples, ctx.step_required_samples + 1):
        idle = dynamic_idle(ctx, wait=wait, switch_s=switch_s)
        if idle < best[1] - 1e-9:
            best = (wait, idle)
    return best


def dynamic_idle(ctx: DynamicScheduleContext, *, wait: int, switch_s: float) -> float:
    """Trainer idle of a cycle with hybrids lent until `wait` samples are queued and a switch costing
    `switch_s`: the queue fills at the windows' measured rate F (0: unmeasured; slower than the pooled
    rate, a window being short against a sample's latency); the replicas' work beyond F in that time is in
    flight (a hybrid's is resumed on a standalone) and is credited after the switch
    (`in_flight_credit_rate`)."""
    standalone_rate, hybrid_rate = rates(ctx)
    if standalone_rate <= 0 or ctx.trainer_s_per_micro_step <= 0:
        return float("inf")
    pooled = standalone_rate + hybrid_rate
    fill_rate = min(pooled, ctx.hybrid_window_samples_per_s or pooled)
    surplus = max(0, ctx.queued_samples)
    fill_s = max(0, wait - surplus) / fill_rate
    serving_rate = ctx.samples_per_replica_s * (ctx.num_standalone_replicas + ctx.num_hybrid_replicas)
    credit = in_flight_credit_rate(pooled=pooled, fill_rate=fill_rate, serving_rate=serving_rate,
                                   load_cost=ctx.decode_load_cost)
    queued = max(wait, surplus) + standalone_rate * switch_s + credit * fill_s
    return fill_s + switch_s + cycle_idle_s(
        queued=queued, rate=standalone_rate, required=ctx.required_samples,
        micro_steps=ctx.trigger_parameter_sync_step, train_s=ctx.trainer_s_per_micro_step)
