"""Built-in "adaptive" policy: switch thresholds from what the controller measured, not a drifting ratio.

Where it sits: registered under "adaptive", chosen by config (`dynamic_schedule_policy`), called
by the controller core in the seed's order with the seed's signatures. Pure: it reads only the
context, which the controller core fills from measurements a live controller has at that moment
(core/measure.py): samples enqueued per replica-second by standalones and by hybrids, the
trainer's seconds per micro-step, the measured switch durations, and the flow-control limits.

The model (a fluid queue over one sync cycle of `trigger` micro-steps of `required` samples):

- Without hybrids the standalones fill the queue at P_s samples/s; a micro-step that finds fewer
  than `required` queued waits for the rest. `static_idle` = the trainer's predicted wait.
- With hybrids, the first micro-step waits until X samples are queued, produced at P_s + P_h,
  then pays the switch (activation + deactivation + the trainer's offload/onload, measured) while
  the standalones keep producing, then trains the cycle at P_s. `dynamic_idle(X)` = its waits plus
  the switch.
- X ranges over [required, step_required]: the hybrids may serve until the whole cycle is queued. Of the
  X with the least idle once the samples left queued for the next cycle are credited (within the carry-over
  room, `adaptive_cycle.best_wait`), the largest: not the knife-edge the cycle's own idle alone picks.
- Rates: P_s is the per-replica rate pooled over whole sync cycles (it credits a hybrid's work
  finished on a standalone after the deactivation; the seconds the rollouter sat idle at its staleness
  limit are left out, core/measure.py); P_h = P_s x `ctx.hybrid_production_gain` (the requests in flight
  the hybrids add, and the standalones' requests spread over more engines at the measured step-vs-batch;
  0 where neither pays: it then never activates); the queue fills during the window at the rate
  measured in the hybrid windows (slower: a window is short against a sample's
  latency); the window's work still in flight at the deactivation is credited after the switch
  (`adaptive_model.in_flight_credit_rate`: beyond P_s + P_h at the engines' marginal rate), for the share of
  the handed-over samples measured to arrive before the next sync (`ctx.handover_on_time_share`). The static
  prediction's wait before the first micro-step uses the rate such waits saw in cycles kept asleep:
  the queue filling right after the sync with the standalones alone, the hybrid window's counterpart
  (samples in flight at the sync finish at their own pace, not at the cycle's average rate); its P_s is
  raised to the rate of steady cycles kept asleep (`ctx.static_samples_per_replica_s`) where that is
  higher: where the hybrids only spread the standalones' requests, the pooled rate falls in the cycles
  that switch, and a static prediction from it made every switch look worth the next.
- Activate iff static_idle - min_X dynamic_idle(X), corrected by the measured errors below (a cycle idles
  no less than 0 staying, no less than its measured switch costs switching), beats MIN_GAIN_FRACTION x the
  cycle's training time plus UNCERTAINTY_Z standard errors of those corrections, and deactivate at that X.

The model checks itself: at each sync the trainer idle the last cycle measured (activation, the wait with
the hybrids lent, deactivation, offload/onload, collection waits) is compared with what the decision
predicted, and the moving average of the error (one per decision kind, stay or activate, and level of the
queue at the sync: it cannot feed the first micro-step, it feeds one, it feeds more) corrects the next
comparisons of that kind at that level; a cycle straying past OUTLIER_SIGMAS standard deviations (a version
waiting for one very long response) counts as that far, and its first wait is not pooled. A level not
measured yet takes no stay correction from another level, and the least activation error measured at the
other levels (`adaptive_model.level_correction`), but not a negative one before a static cycle was measured
(`applied_corrections`); a correction measured once counts its own size as its spread
(`corrections_standard_error`). A model whose switches measured worse than predicted falls back to static
behaviour, and re-measures one switch after RETRY_EVERY cycles kept asleep only by that correction (twice
as many after each re-measure, up to RETRY_MAX); symmetrically, after FIRST_STAY_AFTER (then RETRY_EVERY,
twice as many after each check the next decision overrules, up to RETRY_MAX) activations in a row it stays
asleep once, so the static prediction is measured too. It never activates when the queue will hold the
planned X once the sync is done (no window to fill; `adaptive_cycle.queued_after_sync`).

Every threshold is in the controller's own seconds or relative to a measured duration, so the
policy behaves the same on a time-scaled sim run and on a cluster. Before anything is measured it
activates when the queue cannot feed one micro-step (the first sync: the trainer waits for its first
samples anyway) and the hybrids add samples in flight (the standalones alone hold fewer than max_required;
this blind switch is also the first measurement of a switch) and deactivates at `required` samples;
an unmeasured switch part counts as one micro-step of training; where that prior alone keeps it asleep
(`adaptive_explore.exploring_wait`: a cheaper switch would pay, a dearer one would cost at most
EXPLORE_RUN_SHARE of the run left) it switches once to measure; it stays asleep once the feed is done.
The rebalance is measured too: each choice is tried, the one whose windows filled the queue faster is
kept (`request_rebalance`). Every decision's numbers are kept in `last_decision` and audited.
"""

from __future__ import annotations

from typing import Any

from policies.adaptive_cycle import best_wait, queued_after_sync, rates, static_rate, switch_cost_s
from policies.adaptive_explore import EXPLORE_AFTER, exploring_wait
from policies.adaptive_model import (
    applied_corrections,
    clip_outlier,
    corrections_standard_error,
    cycle_queue,
    first_or_ewma,
    pool_wait,
    pooled_rate,
    queue_level,
    rescaled,
    robust_moving_mean_var,
)
from policies.adaptive_rebalance import choose_rebalance, credit_fill_rate, new_fill_rates
from policies.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy

SWITCH_COST_EWMA = 0.5
"""Weight of the newest measured activation / deactivation in their moving averages."""
MIN_GAIN_FRACTION = 0.04
"""An activation must be predicted to save this fraction of the cycle's training time (about 1 s on
the seed scenario's 25 s cycle): a switch for a smaller gain is within the model's error."""
BIAS_EWMA = 0.3
"""Weight of the newest cycle in the moving averages of the model's measured error (idle measured minus
idle predicted), one for cycles it stayed asleep, one for cycles it activated, overall and per queue level."""
QUEUE_LEVELS = 3
"""Levels of the queue at the sync whose model errors are kept apart: fewer than `required` samples (the
trainer would idle at once), enough for one micro-step, enough for two or more. The fluid model errs
differently at each: lending the GPUs while the queue can already feed the trainer trades training time
for a short window, whose aborted work then loads the standalones (on an engine whose decode step grows
with the batch that costs more than the model sees, on a flat one nothing)."""
UNCERTAINTY_Z = 1.0
"""Standard errors of the two measured corrections by which the corrected gain must beat the minimum gain:
cycles whose idle strays far from the average (a latency-bound trainer waiting for a version's slowest
sample) make a small corrected gain noise, not a reason to switch."""
OUTLIER_SIGMAS = 3.0
"""A cycle whose error strays more than this many standard deviations from its moving mean (a version
waiting for one very long response) moves the mean as if it had strayed this far, and its first wait is
not pooled into the static first-wait rate; the variance takes it whole (so the margin widens)."""
RETRY_EVERY = 16
"""When only the measured error keeps the hybrids asleep, activate once per this many cycles anyway, so
an error measured in other conditions (the workload drifts) is measured again. The same holds the other
way: after this many activations in a row, one cycle stays asleep, so the static prediction it compares
against is measured too."""
RETRY_MAX = 64
"""Each re-measuring switch doubles the wait before the next, up to this many cycles, until an activation
on the model's merit resets it: on a workload that does not drift every re-measure loses a switch. So
with the static checks: one the next decision overrules doubles `stay_after`, one it confirms resets it."""
FIRST_STAY_AFTER = 4
"""Activations in a row after which the first cycle stays asleep to measure the static cycle, while no
static cycle has been measured (a static prediction never checked can keep a useless switch going)."""


@register_policy("adaptive")
class AdaptiveDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """Activate when the measured rates predict the trainer saves more idle time than the switch costs."""

    def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False):
        super().__init__(deactivate_ratio, only_hybrid)
        self.activate_cost_s = -1.0
        """Moving average of measured activation durations (-1: none measured yet; 0 is a measurement)."""
        self.deactivate_cost_s = -1.0
        """Moving average of measured deactivation durations plus the trainer's offload/onload (-1: none)."""
        self.switched = {"activate": False, "deactivate": False}
        """Which switches happened since the last sync (a free switch measures 0 s, not "unmeasured")."""
        self.planned_wait_samples = 0
        """The X chosen when activating; the next deactivation waits for it."""
        self.rebalance_rates = new_fill_rates()
        """Per choice: [moving average of the hybrid window's measured fill rate, windows measured]."""
        self.pending_rebalance_choice = ""
        """The choice made at the last activation, credited when its window's rate is known."""
        self.rebalance_decisions = 0
        self.predicted_idle_s = -1.0
        """The idle the last decision predicted for its cycle (-1: none, e.g. nothing measured yet)."""
        self.predicted_activate = False
        self.cycle_activate_s = 0.0
        """The measured activation of the cycle in progress (known at its sync's update_after_step)."""
        self.cycle_release_s = 0.0
        """The trainer's offload before that activation's wake, when not overlapped with it (an overhead)."""
        self.overhead_at_decision_s = 0.0
        """ctx.last_switch_overhead_s at the last decision (the previous cycle's onload): what it grows by
        until update_after_step is this sync's offload (`cycle_release_s`)."""
        self.idle_bias_cycles = {"stay": 0, "activate": 0}
        """Per decision kind: cycles whose idle was measured against the prediction."""
        self.idle_bias_by_level: dict[str, float] = {}
        """Per decision kind and queue level, keyed "kind@level" (a level measured at least once): moving
        average of (measured - predicted) trainer idle over its cycles."""
        self.idle_error_var_by_level: dict[str, float] = {}
        """Per "kind@level": moving variance of the same errors (how far one cycle strays from the mean)."""
        self.idle_error_count_by_level: dict[str, int] = {}
        """Per "kind@level": cycles measured (a correction measured once has no variance of its own)."""
        self.static_first_fill = [0.0, 0.0]
        """[samples, seconds], decayed sums over the first micro-step's waits in cycles kept asleep (the
        queue filling right after the sync with the standalones alone: the hybrid window's counterpart);
        their ratio is used once they hold a micro-step's worth of samples (`adaptive_model.pooled_rate`)."""
        self.predicted_level = 0
        """The queue level (`adaptive_model.queue_level`) the last decision was taken at."""
        self.bias_unit_s = 0.0
        """The cycle's training time (trigger x the trainer's seconds per micro-step) the corrections are in
        seconds of: when responses lengthen, the errors grow with it (`_rescale_corrections`)."""
        self.stays_by_bias = 0
        """Consecutive cycles kept asleep only by the measured error (the uncorrected model said activate)."""
        self.retry_after = RETRY_EVERY
        """Cycles kept asleep by the error before the next re-measuring switch (RETRY_EVERY to RETRY_MAX)."""
        self.activations_in_row = 0
        """Consecutive cycles the policy activated (a stay to measure the static cycle resets it)."""
        self.stay_after = RETRY_EVERY
        """Activations in a row before the next static check, once a static cycle was measured."""
        self.explore_votes = 0
        """Consecutive decisions that found a switch with an unmeasured part worth measuring."""
        self.static_check_pending = False
        """The last decision was a static check: the next one overrules or confirms it."""
        self.last_decision: dict[str, Any] = {}

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        if self.only_hybrid:
            wait = ctx.step_required_samples
        else:
            wait = self.planned_wait_samples or best_wait(ctx, switch_s=self.switch_cost_s(ctx)).wait
        self.planned_wait_samples = 0
        self.switched["deactivate"] = True
        self.last_decision = {"decision": "deactivate", "wait_for_samples": wait,
                              "carry_over_limit": ctx.carry_over_limit_samples}
        return wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        activate = self._decide(ctx)
        self.switched["activate"] = activate
        return activate

    def _decide(self, ctx: DynamicScheduleContext) -> bool:
        self.overhead_at_decision_s = ctx.last_switch_overhead_s
        self._credit_rebalance_choice(ctx)
        self._credit_prediction(ctx)
        surplus = ctx.queued_samples
        self.predicted_idle_s = -1.0
        if self.only_hybrid:
            self.last_decision = {"decision": "activate", "why": "only_hybrid: hybrids are all the rollout"}
            return True
        if ctx.feed_done or ctx.hybrid_production_gain <= 0:
            self.planned_wait_samples = 0
            why = ("feed done: no new sample will start, lent GPUs would only idle" if ctx.feed_done else
                   "the hybrids would add no production: the standalones hold max_required (the rollouter's "
                   "cap) with engine slots to spare, and spreading them pays nothing at the measured step")
            self.last_decision = {"decision": "stay", "queued": surplus, "why": why}
            return False
        standalone_rate, hybrid_rate = rates(ctx)
        if standalone_rate <= 0 or ctx.trainer_s_per_micro_step <= 0:
            adds_samples = ctx.standalone_samples_in_flight < ctx.max_required_samples  # else it only spreads
            activate = surplus < ctx.required_samples and adds_samples
            self.planned_wait_samples = ctx.required_samples if activate else 0
            self.last_decision = {"decision": "activate" if activate else "stay", "queued": surplus,
                                  "why": "nothing measured yet: activate iff the queue cannot feed a micro-"
                                         "step and the standalones alone hold fewer than max_required",
                                  "wait_for_samples": self.planned_wait_samples}
            return activate
        cycle_train_s = ctx.trigger_parameter_sync_step * ctx.trainer_s_per_micro_step
        self._rescale_corrections(cycle_train_s)
        level = queue_level(ctx.queued_samples, required=ctx.required_samples, levels=QUEUE_LEVELS)
        first_rate = pooled_rate(self.static_first_fill, min_samples=ctx.required_samples)
        asleep_rate = static_rate(ctx, pooled=standalone_rate)
        static = cycle_queue(queued=max(0, surplus), rate=asleep_rate, first_rate=first_rate,
                             required=ctx.required_samples, micro_steps=ctx.trigger_parameter_sync_step,
                             train_s=ctx.trainer_s_per_micro_step)
        static_idle = static.idle_s
        switch_s = self.switch_cost_s(ctx)
        choice = best_wait(ctx, switch_s=switch_s, static=static)
        wait, dynamic_idle = choice.wait, choice.least_idle_s
        min_gain_s = MIN_GAIN_FRACTION * cycle_train_s
        # The model corrected by its own measured error at this queue level: a switch that measured worse
        # than predicted (or static cycles that idled more than predicted) moves the comparison by that much.
        bias = applied_corrections(self.idle_bias_by_level, level=level,
                                   static_measured=bool(self.idle_bias_cycles["stay"]))
        corrected_gain = (max(0.0, static_idle + bias["stay"])
                          - max(switch_s, dynamic_idle + bias["activate"]))
        # No window (the queue holds X once synced; without partial rollout the sync queues those in flight,
        # cut): a switch then only raises the samples in flight for a moment, which is the concurrency's job.
        margin_s = self._bias_uncertainty_s(level)
        activate = corrected_gain > min_gain_s + margin_s and wait > queued_after_sync(ctx)
        why = "corrected gain vs min gain, and a window to fill (X > queued once synced)"
        if not activate and static_idle - dynamic_idle > min_gain_s:
            self.stays_by_bias += 1
            if self.stays_by_bias >= self.retry_after:
                activate = True
                why = f"re-measuring: {self.retry_after} cycles kept asleep by the measured error"
                self.retry_after = min(RETRY_MAX, 2 * self.retry_after)
        elif activate:
            self.retry_after = RETRY_EVERY
        explore_wait = exploring_wait(ctx, activate_s=self.activate_cost_s,
                                      deactivate_s=self.deactivate_cost_s,
                                      static_idle=static_idle + bias["stay"], activate_bias=bias["activate"],
                                      min_gain_s=min_gain_s + margin_s)
        self.explore_votes = self.explore_votes + 1 if explore_wait else 0
        if not activate and self.explore_votes >= EXPLORE_AFTER:
            activate, wait = True, explore_wait
            why = f"exploring: a switch part unmeasured, {EXPLORE_AFTER} cycles in a row worth measuring"
        checking = False
        if activate:
            self.stays_by_bias = 0
            self.activations_in_row += 1
            limit = self.stay_after if self.idle_bias_cycles["stay"] else FIRST_STAY_AFTER
            checking = self.activations_in_row > limit
            if checking:
                activate, why = False, f"re-measuring the static cycle: {limit} activations in a row"
        if self.static_check_pending and not checking:
            self.stay_after = min(RETRY_MAX, 2 * self.stay_after) if activate else RETRY_EVERY
        self.static_check_pending = checking and bool(self.idle_bias_cycles["stay"])
        if not activate:
            self.activations_in_row = 0
        self.predicted_activate = activate
        self.predicted_level = level
        self.predicted_idle_s = choice.idle_s if activate else static_idle
        self.planned_wait_samples = wait if activate else 0
        self.last_decision = {
            "decision": "activate" if activate else "stay", "queued": surplus, "why": why,
            "queued_after_sync": queued_after_sync(ctx), "queue_level": level,
            "idle_bias_s": {k: round(v, 3) for k, v in bias.items()},
            "corrected_gain_s": round(corrected_gain, 3), "uncertainty_s": round(margin_s, 3),
            "standalone_samples_per_s": round(standalone_rate, 4),
            "static_samples_per_s": round(asleep_rate, 4), "first_wait_samples_per_s": round(first_rate, 4),
            "hybrid_samples_per_s": round(hybrid_rate, 4),
            "fill_samples_per_s": round(ctx.hybrid_window_samples_per_s, 4),
            "trainer_s_per_micro_step": round(ctx.trainer_s_per_micro_step, 3),
            "switch_cost_s": round(switch_s, 3), "static_idle_s": round(static_idle, 3),
            "min_gain_s": round(min_gain_s, 3), "dynamic_idle_s": round(dynamic_idle, 3),
            "wait_idle_s": round(choice.idle_s, 3), "carry_value_s": round(choice.carry_value_s, 3),
            "wait_for_samples": wait, "carry_over_limit": ctx.carry_over_limit_samples}
        return activate

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Rebalance or not, by measurement (`policies/adaptive_rebalance.py`)."""
        self.rebalance_decisions += 1
        choice, why = choose_rebalance(self.rebalance_rates, self.rebalance_decisions)
        self.pending_rebalance_choice = choice
        rates = self.rebalance_rates
        self.last_decision["rebalance"] = {
            "choice": choice, "why": why, "windows": {c: stats[1] for c, stats in rates.items()},
            "fill_samples_per_s": {c: round(stats[0], 4) for c, stats in rates.items()}}
        return None if choice == "rebalance" else False

    def _credit_rebalance_choice(self, ctx: DynamicScheduleContext) -> None:
        choice, rate = self.pending_rebalance_choice, ctx.last_hybrid_window_samples_per_s
        if choice and rate > 0:
            credit_fill_rate(self.rebalance_rates, choice, rate)
        self.pending_rebalance_choice = ""

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        # The initial sync's activation is a measurement too: without it the prior (in the controller's
        # seconds, whatever the run's time scale) would gate the next activations.
        if self.only_hybrid:
            return
        self.cycle_activate_s = ctx.last_activate_duration_s
        self.cycle_release_s = max(0.0, ctx.last_switch_overhead_s - self.overhead_at_decision_s)
        self.overhead_at_decision_s = 0.0
        if self.switched["activate"] or ctx.last_activate_duration_s > 0:
            self.activate_cost_s = first_or_ewma(self.activate_cost_s, ctx.last_activate_duration_s,
                                                 weight=SWITCH_COST_EWMA)
        deactivate_s = ctx.last_deactivate_duration_s + ctx.last_switch_overhead_s
        if self.switched["deactivate"] or deactivate_s > 0:
            self.deactivate_cost_s = first_or_ewma(self.deactivate_cost_s, deactivate_s,
                                                   weight=SWITCH_COST_EWMA)
        self.switched = {"activate": False, "deactivate": False}

    def _credit_prediction(self, ctx: DynamicScheduleContext) -> None:
        """Measure the last decision against its cycle: the trainer's idle (activation, the wait with
        the hybrids lent, deactivation, offload/onload, the collections' waits) minus the prediction."""
        if self.predicted_idle_s < 0:
            return
        measured = (self.cycle_activate_s + self.cycle_release_s + ctx.last_deactivate_wait_s
                    + ctx.last_deactivate_duration_s + ctx.last_switch_overhead_s + sum(ctx.step_wait_times))
        kind = "activate" if self.predicted_activate else "stay"
        error = measured - self.predicted_idle_s
        self.idle_bias_cycles[kind] += 1
        key = f"{kind}@{self.predicted_level}"
        self.idle_error_count_by_level[key] = self.idle_error_count_by_level.get(key, 0) + 1
        level_bias = self.idle_bias_by_level.get(key)
        outlier = False
        if level_bias is None:
            self.idle_bias_by_level[key], self.idle_error_var_by_level[key] = error, 0.0
        else:
            variance = self.idle_error_var_by_level.get(key, 0.0)
            outlier = error != clip_outlier(error, level_bias, variance, sigmas=OUTLIER_SIGMAS)
            self.idle_bias_by_level[key], self.idle_error_var_by_level[key] = robust_moving_mean_var(
                level_bias, variance, error, weight=BIAS_EWMA, sigmas=OUTLIER_SIGMAS)
        if not self.predicted_activate and not outlier and ctx.step_wait_samples:
            # a cycle kept asleep: the rate its first micro-step's wait saw
            self.static_first_fill = pool_wait(self.static_first_fill, samples=ctx.step_wait_samples[0],
                                               seconds=ctx.step_wait_times[0], weight=BIAS_EWMA)
        self.predicted_idle_s = -1.0

    def _rescale_corrections(self, unit_s: float) -> None:
        """Keep the measured errors in proportion to the cycle's training time: where samples lengthen as
        the run goes the errors grow with them, which a moving average in seconds would trail."""
        if self.bias_unit_s > 0 and unit_s > 0:
            factor = unit_s / self.bias_unit_s
            self.idle_bias_by_level = rescaled(self.idle_bias_by_level, factor)
            self.idle_error_var_by_level = rescaled(self.idle_error_var_by_level, factor * factor)
        self.bias_unit_s = unit_s or self.bias_unit_s

    def _bias_uncertainty_s(self, level: int) -> float:
        """UNCERTAINTY_Z standard errors of the two corrections compared at `level` (0 where unmeasured)."""
        return UNCERTAINTY_Z * corrections_standard_error(
            self.idle_bias_by_level, self.idle_error_var_by_level, self.idle_error_count_by_level,
            level=level, weight=BIAS_EWMA)

    # ---- the model (pure helpers) ----

    def switch_cost_s(self, ctx: DynamicScheduleContext) -> float:
        """Measured activation + deactivation (+ trainer offload/onload); a part not measured yet counts
        one micro-step of training (a prior in the run's own time units)."""
        return switch_cost_s(activate_s=self.activate_cost_s, deactivate_s=self.deactivate_cost_s,
                             prior_s=ctx.trainer_s_per_micro_step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "switched" not in state:  # saved before a switch measured at 0 s counted: 0 meant "unmeasured"
            self.activate_cost_s = self.activate_cost_s or -1.0
            self.deactivate_cost_s = self.deactivate_cost_s or -1.0

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["measured_switch_cost_s"] = max(0.0, self.activate_cost_s) + max(0.0, self.deactivate_cost_s)
        return info
