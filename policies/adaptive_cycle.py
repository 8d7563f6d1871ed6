"""The adaptive policy's fluid model of one sync cycle, read from the controller's context.

Where it sits: imported by `policies/adaptive_policy.py` only. Pure: each function reads the context and
the switch cost it is given (the policy's measurement or a prior), nothing else; the arithmetic of the
queue is `policies/adaptive_model.py`.

Where the hybrids stop (X, `best_wait`): the cycle's own idle is least at the smallest X after which the
trainer no longer waits once the switch is paid, but every sample X adds beyond it is one the next cycle
need not wait for, produced in this cycle's window at the same rate as in the next one's: the samples it
leaves queued are credited (`adaptive_model.carry_value_s`), which makes the cost flat from that X up to the
carry-over room, and of the X that cost the least the largest is taken. A wait placed at the knife-edge
of the model sends the trainer back to waiting at the standalones' rate on any error (a long-CoT sample
that arrives late); one at the far end of the flat stretch does not. The activation decision itself still
compares the cycle's least idle with the cycle kept asleep (what the measured errors check); the carried
samples only choose X.
"""

from __future__ import annotations

from typing import NamedTuple

from policies.adaptive_model import CycleQueue, carry_value_s, cycle_queue, in_flight_credit_rate
from policies.base import DynamicScheduleContext

WAIT_TIE_S = 1e-6
"""Predicted costs closer than this (seconds) are equal when choosing X: the flat stretch is exact in the
model's arithmetic, so this only absorbs rounding."""


def rates(ctx: DynamicScheduleContext) -> tuple[float, float]:
    """(P_s, P_h) in samples/s from the per-replica rate pooled over whole cycles (hybrid work left
    unfinished at a deactivation completes on a standalone, so a window's rate under-counts it);
    before a cycle closed, the standalones' window rate; P_h what the hybrids would add to it."""
    per_replica = ctx.samples_per_replica_s or ctx.standalone_samples_per_replica_s
    standalone_rate = per_replica * ctx.num_standalone_replicas
    return standalone_rate, standalone_rate * ctx.hybrid_production_gain


def queued_after_sync(ctx: DynamicScheduleContext) -> int:
    """The samples queued once the sync is done: `ctx.queued_samples` plus, without partial rollout, the
    samples in flight, which the sync's abort ends cut and queues (a response with no token yet starts
    over: few at a sync)."""
    return ctx.queued_samples + (0 if ctx.partial_rollout else ctx.generating_samples)


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


class WaitChoice(NamedTuple):
    """The hybrid window `best_wait` chose."""

    wait: int
    """X: the deactivation waits until this many samples are queued."""
    idle_s: float
    """The cycle's predicted trainer idle with that X (what its measured idle is checked against)."""
    least_idle_s: float
    """The least predicted idle over every X (the activation decision's side of the comparison)."""
    carry_value_s: float
    """The next cycle's wait that X's carried samples save (`adaptive_model.carry_value_s`)."""


def best_wait(ctx: DynamicScheduleContext, *, switch_s: float,
              static: CycleQueue | None = None) -> WaitChoice:
    """X over [required, step_required] for a switch costing `switch_s`: the least predicted idle, less
    the carried samples' value against the cycle kept asleep (`static`, when given: up to the samples it
    waits for, and up to what the cycles after this one still train on), the largest X of those that tie."""
    room = max(0, ctx.carry_over_limit_samples - ctx.standalone_samples_in_flight)
    wanted = 0.0 if static is None else static.waited_samples
    if ctx.total_samples > 0:  # nothing carried past the run's last cycle is worth anything
        wanted = min(wanted, max(0, ctx.total_samples - ctx.expected_samples - ctx.step_required_samples))
    chosen = (ctx.required_samples, float("inf"), 0.0)
    least_idle = best_cost = float("inf")
    for wait in range(ctx.required_samples, ctx.step_required_samples + 1):
        cycle, window_rate = dynamic_cycle(ctx, wait=wait, switch_s=switch_s)
        value = 0.0 if static is None else carry_value_s(
            end_samples=cycle.end_samples, static_end_samples=static.end_samples, room=room,
            static_waited=wanted, window_rate=window_rate)
        least_idle = min(least_idle, cycle.idle_s)
        if cycle.idle_s - value <= best_cost + WAIT_TIE_S:
            best_cost = min(best_cost, cycle.idle_s - value)
            chosen = (wait, cycle.idle_s, value)
    wait, idle, value = chosen
    return WaitChoice(wait, idle, least_idle, value)


def dynamic_cycle(ctx: DynamicScheduleContext, *, wait: int, switch_s: float) -> tuple[CycleQueue, float]:
    """(the cycle, the window's rate) with hybrids lent until `wait` samples are queued and a switch
    costing `switch_s`: the queue fills at the windows' measured rate F (0: unmeasured; slower than the
    pooled rate, a window being short against a sample's latency); the replicas' work beyond F in that time
    is in flight (a hybrid's is resumed on a standalone) and is credited after the switch
    (`in_flight_credit_rate`), for the share of it measured to arrive within the cycle
    (`ctx.handover_on_time_share`: the rest feeds the next cycle, whose measured rates count it). The
    cycle's idle counts the window and the switch; the window's rate is F plus that credit (what a sample
    costs in a window)."""
    standalone_rate, hybrid_rate = rates(ctx)
    if standalone_rate <= 0 or ctx.trainer_s_per_micro_step <= 0:
        return CycleQueue(float("inf"), float("inf"), 0.0), 0.0
    pooled = standalone_rate + hybrid_rate
    fill_rate = min(pooled, ctx.hybrid_window_samples_per_s or pooled)
    surplus = max(0, ctx.queued_samples)
    fill_s = max(0, wait - surplus) / fill_rate
    serving_rate = ctx.samples_per_replica_s * (ctx.num_standalone_replicas + ctx.num_hybrid_replicas)
    credit = ctx.handover_on_time_share * in_flight_credit_rate(
        pooled=pooled, fill_rate=fill_rate, serving_rate=serving_rate, load_cost=ctx.decode_load_cost)
    queued = max(wait, surplus) + standalone_rate * switch_s + credit * fill_s
    after = cycle_queue(queued=queued, rate=standalone_rate, required=ctx.required_samples,
                        micro_steps=ctx.trigger_parameter_sync_step, train_s=ctx.trainer_s_per_micro_step)
    return after._replace(idle_s=fill_s + switch_s + after.idle_s), fill_rate + credit
