"""Pure unit tests of the "adaptive" policy and of what the controller measures for it (core.measure)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.measure import RateMeter
from policies import AdaptiveDynamicSchedulePolicy, DynamicScheduleContext, build_policy
from policies.adaptive_model import (
    carry_value_s,
    cycle_queue,
    in_flight_credit_rate,
    moving_mean_var,
    robust_moving_mean_var,
    standard_error,
)
from policies.adaptive_policy import FIRST_STAY_AFTER, RETRY_EVERY, RETRY_MAX


def make_ctx(
    *,
    required_samples: int = 16,
    trigger_parameter_sync_step: int = 4,
    staleness_threshold: float = 0.5,
    surplus: int = 0,
    samples_per_replica_s: float = 0.0,
    standalone_samples_per_replica_s: float = 0.0,
    hybrid_window_samples_per_s: float = 0.0,
    trainer_s_per_micro_step: float = 0.0,
    num_standalone_replicas: int = 2,
    num_hybrid_replicas: int = 2,
    concurrent_samples_per_replica: int = 0,
) -> DynamicScheduleContext:
    ctx = DynamicScheduleContext(required_samples=required_samples,
                                 trigger_parameter_sync_step=trigger_parameter_sync_step,
                                 staleness_threshold=staleness_threshold,
                                 num_standalone_replicas=num_standalone_replicas,
                                 num_hybrid_replicas=num_hybrid_replicas,
                                 concurrent_samples_per_replica=concurrent_samples_per_replica)
    ctx.expected_samples = 10 * ctx.step_required_samples
    ctx.total_generated_samples = ctx.expected_samples + surplus
    ctx.samples_per_replica_s = samples_per_replica_s
    ctx.standalone_samples_per_replica_s = standalone_samples_per_replica_s
    ctx.hybrid_window_samples_per_s = hybrid_window_samples_per_s
    ctx.trainer_s_per_micro_step = trainer_s_per_micro_step
    return ctx


def make_adaptive(*, only_hybrid: bool = False) -> AdaptiveDynamicSchedulePolicy:
    policy = build_policy("adaptive", deactivate_ratio=0.3, only_hybrid=only_hybrid)
    assert isinstance(policy, AdaptiveDynamicSchedulePolicy)
    return policy


def production_bound(**overrides: float) -> DynamicScheduleContext:
    """Seed-like: 2 + 2 replicas at 0.75 samples/s each, 6 s micro-steps of 16 samples, queue 10."""
    values = {"surplus": 10, "samples_per_replica_s": 0.75, "standalone_samples_per_replica_s": 0.9,
              "hybrid_window_samples_per_s": 1.2, "trainer_s_per_micro_step": 6.0, **overrides}
    return make_ctx(**values)  # type: ignore[arg-type]


# ---- the fluid model ----


def test_a_queue_that_outpaces_the_trainer_predicts_no_idle():
    assert cycle_queue(queued=16, rate=3.0, required=16, micro_steps=4, train_s=6.0).idle_s == 0.0


def test_the_first_wait_can_have_its_own_rate_and_the_later_ones_keep_the_cycle_rate():
    idle = cycle_queue(queued=0, rate=1.0, required=16, micro_steps=2, train_s=6.0, first_rate=4.0).idle_s
    assert idle == pytest.approx(16 / 4.0 + (16 - 6.0) / 1.0)


def test_the_moving_variance_of_a_constant_is_zero_and_of_an_alternation_is_positive():
    mean, variance = 5.0, 0.0
    for _ in range(10):
        mean, variance = moving_mean_var(mean, variance, 5.0, weight=0.3)
    assert (mean, variance) == (5.0, 0.0)
    for value in [0.0, 10.0] * 10:
        mean, variance = moving_mean_var(mean, variance, value, weight=0.3)
    assert 15.0 < variance < 35.0  # about 25 (5 either side of the mean)
    assert standard_error(variance, weight=0.3) < variance ** 0.5


def test_an_outlier_moves_the_mean_only_to_its_clip_and_the_variance_by_all_of_it():
    mean, variance = robust_moving_mean_var(0.0, 4.0, 100.0, weight=0.3, sigmas=3.0)  # clipped to 0 + 3 x 2
    assert mean == pytest.approx(0.3 * 6.0)
    assert variance == pytest.approx(moving_mean_var(0.0, 4.0, 100.0, weight=0.3)[1])
    assert robust_moving_mean_var(0.0, 4.0, 5.0, weight=0.3, sigmas=3.0) == moving_mean_var(
        0.0, 4.0, 5.0, weight=0.3)  # within the clip: the plain update
    assert robust_moving_mean_var(0.0, 0.0, 100.0, weight=0.3, sigmas=3.0) == moving_mean_var(
        0.0, 0.0, 100.0, weight=0.3)  # no spread measured yet: nothing to clip against


def test_an_empty_queue_waits_for_the_first_micro_step_at_the_production_rate():
    idle = cycle_queue(queued=0, rate=4.0, required=16, micro_steps=1, train_s=6.0).idle_s
    assert idle == pytest.approx(4.0)


def test_no_production_and_a_short_queue_predict_an_endless_wait():
    assert math.isinf(cycle_queue(queued=0, rate=0.0, required=16, micro_steps=1, train_s=6.0).idle_s)


# ---- decisions ----


def test_the_carry_over_limit_is_max_required_minus_step_required():
    ctx = make_ctx(required_samples=16, trigger_parameter_sync_step=4, staleness_threshold=0.5)
    assert (ctx.max_required_samples, ctx.carry_over_limit_samples) == (96, 32)


def test_with_nothing_measured_it_activates_when_the_queue_cannot_feed_one_micro_step():
    policy = make_adaptive()
    assert policy.should_activate_after_step(0, False, make_ctx(surplus=-64)) is True
    assert policy.deactivate_wait_samples(make_ctx()) == 16


def test_with_nothing_measured_it_activates_only_if_the_hybrids_add_samples_in_flight():
    # max_required = 16 x 1.5 x 4 = 96 samples; the rollouter keeps min(replicas x per replica, 96) in flight
    below = make_ctx(surplus=-64, concurrent_samples_per_replica=47)  # 2 standalones hold 94
    assert make_adaptive().should_activate_after_step(0, False, below) is True
    at_cap = make_ctx(surplus=-64, concurrent_samples_per_replica=48)  # 96: the hybrids would add none
    policy = make_adaptive()
    assert policy.should_activate_after_step(0, False, at_cap) is False
    assert "hybrids would add no production" in policy.last_decision["why"]


def test_the_samples_the_standalones_hold_in_flight_are_capped_at_max_required():
    assert make_ctx(concurrent_samples_per_replica=16).standalone_samples_in_flight == 2 * 16
    assert make_ctx(concurrent_samples_per_replica=64).standalone_samples_in_flight == 96


def test_hybrids_add_running_requests_where_the_standalones_engines_are_full_even_at_max_required():
    # 2 x 48 = 96 samples x n 8 = 768 requests on the standalones, which run 128 each: the hybrids'
    # engines run 256 more of the same samples' requests
    full = make_ctx(concurrent_samples_per_replica=48)
    full.responses_per_sample, full.max_running_requests_per_replica = 8, 128
    assert full.running_requests(samples=96, replicas=2) == 256
    assert full.hybrid_production_gain == 1.0
    # n 2: 192 requests fit in the standalones' 256 slots, so the hybrids would run none of their own
    roomy = make_ctx(concurrent_samples_per_replica=48)
    roomy.responses_per_sample, roomy.max_running_requests_per_replica = 2, 128
    assert roomy.hybrid_production_gain == 0.0


def test_the_blind_start_up_switch_waits_for_a_measurement_where_the_standalones_hold_max_required():
    # engines full (share 1: the hybrids would run requests), but no sample of the hybrids' own: the
    # one switch taken before anything is measured is skipped, as in session 20
    full = make_ctx(surplus=-64, concurrent_samples_per_replica=48)
    full.responses_per_sample, full.max_running_requests_per_replica = 8, 128
    assert full.hybrid_production_gain == 1.0
    policy = make_adaptive()
    assert policy.should_activate_after_step(0, False, full) is False
    assert "nothing measured yet" in policy.last_decision["why"]


def test_a_production_bound_cycle_stays_asleep_where_the_standalones_already_fill_max_required():
    # the same measured rates that activate below (production_bound), but 2 x 48 = 96 samples in flight
    # on the standalones alone: the hybrids would add no sample in flight, so no rate
    policy = make_adaptive()
    at_cap = production_bound(concurrent_samples_per_replica=48)
    assert policy.should_activate_after_step(8, False, at_cap) is False
    assert "hybrids would add no production" in policy.last_decision["why"]
    below_cap = production_bound(concurrent_samples_per_replica=16)
    assert make_adaptive().should_activate_after_step(8, False, below_cap) is True


def test_with_nothing_measured_a_queue_that_feeds_a_micro_step_keeps_the_hybrids_asleep():
    assert make_adaptive().should_activate_after_step(4, False, make_ctx(surplus=20)) is False


def test_a_production_bound_cycle_activates_and_waits_for_at_most_a_cycle_of_samples():
    policy = make_adaptive()
    ctx = production_bound()
    assert policy.should_activate_after_step(8, False, ctx) is True
    decision = policy.last_decision
    assert decision["static_idle_s"] - decision["dynamic_idle_s"] > decision["min_gain_s"] > 0
    wait = policy.deactivate_wait_samples(ctx)
    assert ctx.required_samples <= wait <= ctx.step_required_samples
    assert wait == decision["wait_for_samples"]


def test_without_partial_rollout_the_samples_the_sync_will_cut_leave_no_window_to_fill():
    # The sync's abort ends every sample in flight cut and queues it: a queue of 10 with 40 in flight holds
    # 50 once synced, more than any X this cycle plans, so lending the GPUs would only pay the switch.
    policy = make_adaptive()
    ctx = production_bound()
    ctx.generating_samples = 40
    assert policy.should_activate_after_step(8, False, ctx) is True  # with partial rollout they resume
    ctx.partial_rollout = False
    policy = make_adaptive()
    assert policy.should_activate_after_step(8, False, ctx) is False
    decision = policy.last_decision
    assert decision["static_idle_s"] - decision["dynamic_idle_s"] > decision["min_gain_s"]
    assert decision["wait_for_samples"] <= decision["queued_after_sync"] == 10 + 40


def test_fast_hybrid_windows_may_keep_the_hybrids_past_the_carry_over_limit():
    # staleness 0: nothing carries over, yet hybrids that fill the queue 3x faster than the standalones
    # alone shorten the cycle's later waits too, so the model plans a window past one micro-step
    policy = make_adaptive()
    ctx = production_bound(staleness_threshold=0.0, hybrid_window_samples_per_s=3.0)
    assert ctx.carry_over_limit_samples == 0
    assert policy.should_activate_after_step(8, False, ctx) is True
    wait = policy.deactivate_wait_samples(ctx)
    assert ctx.required_samples < wait <= ctx.step_required_samples


def test_window_work_beyond_the_modelled_production_is_credited_at_the_engines_marginal_rate():
    # the model's own excess over the queue's fill is credited whole; the serving replicas' work beyond
    # the model (progress on samples the standalones would have run anyway) at 1 / (1 + load cost)
    def credit(serving_rate: float, load_cost: float, fill_rate: float = 0.8) -> float:
        return in_flight_credit_rate(pooled=1.0, fill_rate=fill_rate, serving_rate=serving_rate,
                                     load_cost=load_cost)

    assert credit(1.6, load_cost=0.0) == pytest.approx(0.2 + 0.6)
    assert credit(1.6, load_cost=1.0) == pytest.approx(0.2 + 0.3)  # a step twice its fixed part
    assert credit(0.6, load_cost=0.0, fill_rate=1.0) == 0.0  # nothing beyond the model, nothing in flight


def test_a_window_whose_replicas_worked_beyond_the_modelled_production_ends_sooner():
    # the standalones alone hold 64 of max_required 96: the hybrids add half as much again (P_h = P_s / 2),
    # yet all four replicas worked at the pooled per-replica rate; what they left in flight finishes on
    # the standalones after the switch, so fewer samples need to be queued before it
    def planned_wait(pooled_per_replica_s: float) -> int:
        ctx = production_bound(surplus=0, concurrent_samples_per_replica=32, trainer_s_per_micro_step=4.0,
                               samples_per_replica_s=pooled_per_replica_s,
                               standalone_samples_per_replica_s=0.75, hybrid_window_samples_per_s=1.5)
        policy = make_adaptive()
        assert policy.should_activate_after_step(8, False, ctx) is True
        return policy.deactivate_wait_samples(ctx)

    unmeasured = planned_wait(0.0)  # no whole cycle measured: P_s from the standalones' windows alone
    measured = planned_wait(0.75)  # the same P_s, and every serving replica's work measured
    assert (unmeasured, measured) == (23, 17)  # unmeasured: X 22 and 23 tie (23 waits for no sample)


def test_a_window_whose_handed_over_samples_arrive_late_waits_for_more_samples_before_the_switch():
    # the same window as above, its in-flight work credited for the share measured to arrive in the cycle
    def planned_wait(on_time_share: float) -> int:
        ctx = production_bound(surplus=0, concurrent_samples_per_replica=32, trainer_s_per_micro_step=4.0,
                               samples_per_replica_s=0.75, standalone_samples_per_replica_s=0.75,
                               hybrid_window_samples_per_s=1.5)
        ctx.handover_on_time_share = on_time_share
        policy = make_adaptive()
        if not policy.should_activate_after_step(8, False, ctx):
            return 0
        return policy.deactivate_wait_samples(ctx)

    assert planned_wait(1.0) == 17  # every handed-over sample arrives in the cycle: as before
    assert planned_wait(1.0) < planned_wait(0.5) < planned_wait(0.2)  # the queue must hold more at the switch
    assert planned_wait(0.0) == 0  # nothing credited: the window no longer pays here


def test_the_meter_pools_the_on_time_share_of_handed_over_samples_over_the_windows_that_had_any():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    assert meter.handover_on_time_share == 1.0  # unmeasured: the model's assumption
    meter.record_handover(handed_over=10, on_time=2)
    assert meter.handover_on_time_share == pytest.approx(0.2)
    meter.record_handover(handed_over=0, on_time=0)  # a cycle kept asleep (or a rollouter from before)
    assert meter.handover_on_time_share == pytest.approx(0.2)
    meter.record_handover(handed_over=10, on_time=10)
    assert meter.handover_on_time_share == pytest.approx((0.8 * 2 + 10) / (0.8 * 10 + 10))


def test_samples_a_window_leaves_queued_are_worth_the_next_cycles_wait_only_within_the_carry_over_room():
    def value(end: float, *, room: float = 20.0, static_waited: float = 10.0) -> float:
        return carry_value_s(end_samples=end, static_end_samples=4.0, room=room, static_waited=static_waited,
                             window_rate=2.0)

    assert value(10.0) == pytest.approx((10.0 - 4.0) / 2.0)
    assert value(30.0) == pytest.approx(10.0 / 2.0)  # no more than the cycle kept asleep waits for
    assert value(30.0, static_waited=40.0) == pytest.approx((20.0 - 4.0) / 2.0)  # none past the room
    assert value(30.0, room=3.0) == 0.0  # the standalones' own samples in flight fill the carry-over
    assert value(2.0) == 0.0


def test_a_window_waits_past_the_one_cycle_optimum_for_what_the_next_cycle_would_wait_for():
    # production-bound, carry-over 32 samples: the cycle's least idle is at X 17; each sample more costs
    # its window time now and saves the same in the next cycle, so X runs on while there is carry-over
    # room left beside the standalones' samples in flight (2 x 8: room 16; 2 x 16: none)
    def decide(concurrency: int) -> tuple[int, dict[str, Any]]:
        ctx = production_bound(surplus=0, concurrent_samples_per_replica=concurrency,
                               trainer_s_per_micro_step=4.0, samples_per_replica_s=0.75,
                               standalone_samples_per_replica_s=0.75, hybrid_window_samples_per_s=1.5)
        policy = make_adaptive()
        assert policy.should_activate_after_step(8, False, ctx) is True
        decision = dict(policy.last_decision)
        return policy.deactivate_wait_samples(ctx), decision

    (roomy, with_room), (full, without_room) = decide(8), decide(16)
    assert (roomy, full) == (22, 17)
    # the activation decision compares the least idle, the same in both
    assert with_room["dynamic_idle_s"] == without_room["dynamic_idle_s"]
    net = with_room["wait_idle_s"] - with_room["carry_value_s"]
    assert net == pytest.approx(with_room["dynamic_idle_s"], abs=0.01)  # X 22 costs what X 17 does
    assert without_room["carry_value_s"] == 0.0


def test_a_consumption_bound_cycle_never_activates():
    ctx = production_bound(surplus=30, samples_per_replica_s=3.0, standalone_samples_per_replica_s=3.0)
    policy = make_adaptive()
    assert policy.should_activate_after_step(8, False, ctx) is False
    assert policy.last_decision["static_idle_s"] == 0.0


def test_the_static_prediction_uses_what_cycles_without_hybrids_produced_once_one_was_measured():
    pooled = production_bound()
    measured_alone = production_bound()
    measured_alone.static_samples_per_replica_s = 2.0  # the cycles no hybrid served in: faster than pooled
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, pooled)
    pooled_static_idle = policy.last_decision["static_idle_s"]
    policy.should_activate_after_step(12, False, measured_alone)
    assert policy.last_decision["static_samples_per_s"] == pytest.approx(4.0)  # 2 standalones x 2.0
    assert policy.last_decision["standalone_samples_per_s"] == pytest.approx(1.5)  # the pooled P_s, unchanged
    assert policy.last_decision["static_idle_s"] < pooled_static_idle


def test_steady_cycles_kept_asleep_slower_than_the_pooled_rate_leave_the_static_prediction_alone():
    pooled = production_bound()
    slow_tail = production_bound()
    slow_tail.static_samples_per_replica_s = 0.3  # a version that waited for its longest samples
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, pooled)
    pooled_decision = dict(policy.last_decision)
    policy.should_activate_after_step(12, False, slow_tail)
    assert policy.last_decision["static_samples_per_s"] == pytest.approx(1.5)  # the pooled P_s
    assert policy.last_decision["static_idle_s"] == pytest.approx(pooled_decision["static_idle_s"])


def test_an_expensive_measured_switch_keeps_the_hybrids_asleep():
    policy = make_adaptive()
    ctx = production_bound()
    ctx.last_activate_duration_s, ctx.last_deactivate_duration_s = 60.0, 60.0
    policy.update_after_step(8, ctx)
    assert policy.switch_cost_s(ctx) == pytest.approx(120.0)
    assert policy.should_activate_after_step(12, False, production_bound()) is False


def test_a_switch_part_not_measured_yet_counts_as_one_micro_step_of_training():
    policy = make_adaptive()
    ctx = make_ctx(trainer_s_per_micro_step=6.0)
    assert policy.switch_cost_s(ctx) == 12.0  # nothing measured: one micro-step each
    ctx.last_activate_duration_s = 2.0
    policy.update_after_step(4, ctx)
    assert policy.switch_cost_s(ctx) == 2.0 + 6.0
    ctx.last_activate_duration_s, ctx.last_deactivate_duration_s, ctx.last_switch_overhead_s = 0.0, 3.0, 1.0
    policy.update_after_step(8, ctx)
    assert policy.switch_cost_s(ctx) == pytest.approx(2.0 + 4.0)


def unmeasured_but_close(*, cycles_left: int = 300, surplus: int = 10) -> DynamicScheduleContext:
    """A cycle the unmeasured switch's prior (two 10-s micro-steps) keeps asleep, where a switch at half
    that prior would pay: 2 standalones at 0.5 samples/s, a fast window, `cycles_left` cycles to train."""
    ctx = production_bound(surplus=surplus, samples_per_replica_s=0.5, standalone_samples_per_replica_s=0.5,
                           hybrid_window_samples_per_s=1.5, trainer_s_per_micro_step=10.0)
    ctx.total_samples = ctx.expected_samples + cycles_left * ctx.step_required_samples
    return ctx


def test_a_switch_never_measured_is_tried_after_two_cycles_in_which_half_its_prior_would_pay():
    policy = make_adaptive()
    assert policy.should_activate_after_step(8, False, unmeasured_but_close()) is False
    policy.predicted_idle_s = -1.0  # no cycle measured in between: the model is not corrected
    assert policy.should_activate_after_step(12, False, unmeasured_but_close()) is True
    assert policy.last_decision["why"].startswith("exploring")
    assert policy.last_decision["wait_for_samples"] > policy.last_decision["queued"]


def test_an_unmeasured_switch_is_not_tried_where_three_times_its_prior_would_cost_over_1pct_of_the_run_left():
    # the prior is 2 x 10 s; a static cycle is 4 x 10 s of training + 24 s of waits: 3 x 20 s is 1% of
    # 94 such cycles
    for cycles_left in (90, 1, 0, -10):  # -10: total_samples 0, the run's length not given
        policy = make_adaptive()
        for step in range(1, 6):
            assert policy.should_activate_after_step(4 * step, False, unmeasured_but_close(
                cycles_left=cycles_left)) is False
            policy.predicted_idle_s = -1.0


def test_one_cycle_worth_trying_an_unmeasured_switch_between_others_is_not_enough():
    policy = make_adaptive()
    full_queue = unmeasured_but_close(surplus=40)  # no wait before the cycle: nothing to gain
    for ctx in (unmeasured_but_close(), full_queue, unmeasured_but_close(), full_queue):
        assert policy.should_activate_after_step(8, False, ctx) is False
        policy.predicted_idle_s = -1.0


def test_the_decision_is_the_same_in_any_time_unit():
    """A time-scaled sim run measures wall seconds: every threshold scales with the measurements."""
    fast, slow = make_adaptive(), make_adaptive()
    ctx = production_bound()
    scaled = production_bound(samples_per_replica_s=0.75 * 20, standalone_samples_per_replica_s=0.9 * 20,
                              hybrid_window_samples_per_s=1.2 * 20, trainer_s_per_micro_step=6.0 / 20)
    assert fast.should_activate_after_step(8, False, ctx) == slow.should_activate_after_step(8, False, scaled)
    assert fast.last_decision["wait_for_samples"] == slow.last_decision["wait_for_samples"]
    assert fast.last_decision["static_idle_s"] == pytest.approx(20 * slow.last_decision["static_idle_s"],
                                                                rel=1e-2)


def test_the_initial_sync_activation_counts_as_a_measured_switch():
    policy = make_adaptive()
    ctx = make_ctx()
    ctx.last_activate_duration_s = 0.5
    policy.update_after_step(0, ctx)
    assert policy.activate_cost_s == 0.5


def test_the_rebalance_is_always_vetoed():
    assert make_adaptive().request_rebalance(4, production_bound()) is False


def test_colocated_mode_always_activates_and_waits_for_a_full_cycle():
    policy = make_adaptive(only_hybrid=True)
    ctx = make_ctx(num_standalone_replicas=0)
    assert policy.should_activate_after_step(4, False, ctx) is True
    assert policy.deactivate_wait_samples(ctx) == ctx.step_required_samples


def test_every_decision_is_explained_with_the_numbers_it_compared():
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, production_bound())
    explained = policy.explain_last_decision()
    for key in ("decision", "queued", "standalone_samples_per_s", "hybrid_samples_per_s",
                "trainer_s_per_micro_step", "switch_cost_s", "static_idle_s", "dynamic_idle_s",
                "wait_for_samples", "carry_over_limit"):
        assert key in explained
    policy.deactivate_wait_samples(production_bound())
    assert policy.explain_last_decision()["decision"] == "deactivate"


def test_the_policy_state_survives_a_state_dict_round_trip():
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, production_bound())
    restored = make_adaptive()
    restored.load_state_dict(policy.state_dict())
    assert restored.planned_wait_samples == policy.planned_wait_samples
    assert restored.last_decision == policy.last_decision


# ---- core.measure ----


def test_the_meter_measures_standalone_production_per_replica_second_between_readings():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.read_progress(0.0, 0, cycle_end=True)
    meter.read_progress(10.0, 20, cycle_end=True)
    assert meter.standalone_samples_per_replica_s == pytest.approx(1.0)
    assert meter.samples_per_replica_s == pytest.approx(1.0)
    assert meter.hybrid_samples_per_replica_s == 0.0


def test_the_meter_credits_hybrids_only_with_what_the_standalones_rate_does_not_explain():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.read_progress(0.0, 0, cycle_end=True)
    meter.read_progress(10.0, 20)  # standalones alone: 1 sample per replica-second
    meter.set_serving(10.0, hybrids=2)
    meter.read_progress(20.0, 50)  # 30 samples in 10 s: 20 explained by the standalones
    assert meter.hybrid_samples_per_replica_s == pytest.approx(0.5)
    assert meter.hybrid_window_samples_per_s == pytest.approx(3.0)


def test_samples_an_abort_cut_count_in_the_sync_cycle_but_not_in_the_window_they_landed_in():
    def meter_after(cut: int) -> RateMeter:
        meter = RateMeter(num_standalone=2, num_hybrid=2)
        meter.read_progress(0.0, 0, cycle_end=True)
        meter.read_progress(10.0, 20, cycle_end=True)
        meter.set_serving(10.0, hybrids=2)
        # a 10 ms window: the standalones' sync cut 30 samples into the queue as it opened
        meter.read_progress(10.01, 50, cut_samples=cut)
        meter.set_serving(10.01, hybrids=0)
        meter.read_progress(20.0, 70, cycle_end=True, cut_samples=cut)
        return meter

    counted, cut = meter_after(0), meter_after(30)
    assert counted.hybrid_window_samples_per_s == pytest.approx(3000.0)  # what a live run measured
    assert cut.hybrid_window_samples_per_s == 0.0
    assert cut.samples_per_replica_s == pytest.approx(counted.samples_per_replica_s)


def test_the_meter_counts_no_serving_time_while_the_standalones_sync():
    meter = RateMeter(num_standalone=2, num_hybrid=0)
    meter.read_progress(0.0, 0, cycle_end=True)
    meter.set_serving(0.0, standalones=0)
    meter.set_serving(5.0, standalones=2)
    meter.read_progress(15.0, 20, cycle_end=True)
    assert meter.standalone_samples_per_replica_s == pytest.approx(1.0)


def cycle(meter: RateMeter, start_s: float, generated: int, *, hybrids_until_s: float = 0.0) -> None:
    """One 10-s sync cycle from `start_s`, ending with `generated` samples so far; the hybrids serve
    until `hybrids_until_s` if it is later than the start."""
    if hybrids_until_s > start_s:
        meter.set_serving(start_s, hybrids=2)
        meter.read_progress(hybrids_until_s, generated - 10)
        meter.set_serving(hybrids_until_s, hybrids=0)
    meter.read_progress(start_s + 10.0, generated, cycle_end=True)


def test_the_meter_measures_the_standalones_alone_only_in_steady_cycles_after_the_first_switch():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.record_micro_step(10.0)
    meter.read_progress(0.0, 0, cycle_end=True)
    cycle(meter, 0.0, 40)  # standalones alone, before any switch: the pooled rate is this measurement
    assert meter.samples_per_replica_s == pytest.approx(2.0)
    assert meter.static_samples_per_replica_s == 0.0
    cycle(meter, 10.0, 60, hybrids_until_s=15.0)  # a switch that only spread the same work
    assert meter.samples_per_replica_s < 2.0
    cycle(meter, 20.0, 90)  # asleep, but right after the switch (its work handed over): not counted
    assert meter.static_samples_per_replica_s == 0.0
    cycle(meter, 30.0, 130)  # asleep after a cycle asleep: the standalones alone, 2 per replica-second
    assert meter.static_samples_per_replica_s == pytest.approx(2.0)
    cycle(meter, 40.0, 150, hybrids_until_s=45.0)
    cycle(meter, 50.0, 170, hybrids_until_s=55.0)
    assert meter.samples_per_replica_s < 1.6  # the pooled rate falls while the switches go on
    assert meter.static_samples_per_replica_s == pytest.approx(2.0)  # what staying produces does not


def test_a_switch_whose_window_closed_at_once_still_leaves_the_next_cycle_unsteady():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.record_micro_step(10.0)
    meter.read_progress(0.0, 0, cycle_end=True)
    meter.set_serving(0.0, hybrids=2)  # added and removed at one instant: no serving time
    meter.set_serving(0.0, hybrids=0)
    meter.read_progress(10.0, 40, cycle_end=True)
    cycle(meter, 10.0, 60)  # asleep right after that switch: not steady
    assert meter.static_samples_per_replica_s == 0.0
    cycle(meter, 20.0, 100)
    assert meter.static_samples_per_replica_s == pytest.approx(2.0)


def test_a_meter_built_while_hybrids_serve_counts_its_first_cycle_as_one_with_hybrids():
    """A controller restarted in HYBRID_ACTIVE builds its meter with the hybrids serving: the cycle they
    serve in, and the one after it, are not steady cycles asleep."""
    meter = RateMeter(num_standalone=2, num_hybrid=2, hybrids_serving=2)
    meter.record_micro_step(10.0)
    meter.read_progress(0.0, 0, cycle_end=True)
    meter.set_serving(5.0, hybrids=0)
    meter.read_progress(10.0, 40, cycle_end=True)
    cycle(meter, 10.0, 60)  # asleep right after the hybrids served: not steady
    assert meter.static_samples_per_replica_s == 0.0
    cycle(meter, 20.0, 100)
    assert meter.static_samples_per_replica_s == pytest.approx(2.0)


def test_the_meter_scales_the_standalones_alone_by_the_trainers_micro_step_time_then_over_now():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.record_micro_step(10.0)
    meter.read_progress(0.0, 0, cycle_end=True)
    cycle(meter, 0.0, 20, hybrids_until_s=5.0)
    cycle(meter, 10.0, 50)
    cycle(meter, 20.0, 90)  # a steady cycle asleep: 2 samples per replica-second
    assert meter.static_samples_per_replica_s == pytest.approx(2.0)
    for _ in range(40):  # the samples lengthen: the trainer now takes twice as long per micro-step
        meter.record_micro_step(20.0)
    assert meter.static_samples_per_replica_s == pytest.approx(1.0, rel=1e-3)


def test_the_meter_averages_trainer_micro_steps_and_ignores_negative_durations():
    meter = RateMeter(num_standalone=1, num_hybrid=1)
    meter.record_micro_step(6.0)
    meter.record_micro_step(-1.0)
    assert meter.trainer_s_per_micro_step == 6.0
    meter.record_micro_step(16.0)
    assert 6.0 < meter.trainer_s_per_micro_step < 16.0


def test_the_meter_leaves_the_rollouters_idle_seconds_out_of_the_replica_seconds():
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.read_progress(0.0, 0, cycle_end=True, idle_s=3.0)
    meter.read_progress(10.0, 10, cycle_end=True, idle_s=8.0)  # idle (paused, nothing generating) 5 s of 10
    assert meter.standalone_samples_per_replica_s == pytest.approx(1.0)  # 10 samples in 2 x 5 busy seconds
    assert meter.samples_per_replica_s == pytest.approx(1.0)
    meter.set_serving(10.0, hybrids=2)
    meter.read_progress(20.0, 40, idle_s=13.0)  # a hybrid window idle half its time too
    assert meter.hybrid_samples_per_replica_s == pytest.approx(2.0)  # (30 - 10 explained) / (2 x 5)
    assert meter.hybrid_window_samples_per_s == pytest.approx(3.0)  # the queue's fill: wall seconds


def test_the_meter_without_idle_readings_counts_every_serving_second():
    meter = RateMeter(num_standalone=2, num_hybrid=0)
    meter.read_progress(0.0, 0, cycle_end=True, idle_s=-1.0)
    meter.read_progress(10.0, 10, cycle_end=True, idle_s=-1.0)
    assert meter.standalone_samples_per_replica_s == pytest.approx(0.5)


def test_the_queue_read_at_the_sync_replaces_the_seed_estimate_of_it():
    ctx = production_bound(surplus=-32)
    ctx.queue_size = 40
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, ctx)
    assert policy.last_decision["queued"] == 40


def test_once_every_prompt_was_fed_the_hybrids_stay_asleep():
    ctx = production_bound(surplus=0)
    ctx.feed_done = True
    policy = make_adaptive()
    assert policy.should_activate_after_step(8, False, ctx) is False
    assert "feed done" in policy.last_decision["why"]


# ---- the model checked against what its cycles measured ----


def _activate_and_sync(policy: AdaptiveDynamicSchedulePolicy) -> None:
    """Activate on a production-bound context; the activation measures 2 s; the hybrids deactivate."""
    ctx = production_bound()
    assert policy.should_activate_after_step(8, False, ctx) is True
    ctx.last_activate_duration_s = 2.0
    policy.update_after_step(8, ctx)
    policy.deactivate_wait_samples(ctx)


def test_a_switch_that_measured_far_worse_than_predicted_keeps_the_next_cycle_asleep():
    policy = make_adaptive()
    _activate_and_sync(policy)
    ctx = production_bound()
    ctx.last_deactivate_wait_s, ctx.last_deactivate_duration_s = 60.0, 3.0
    assert policy.should_activate_after_step(12, False, ctx) is False
    decision = policy.last_decision
    assert decision["idle_bias_s"]["activate"] > 40.0  # 65 s measured, ~17 s predicted
    assert decision["static_idle_s"] - decision["dynamic_idle_s"] > decision["min_gain_s"]  # uncorrected: go


def test_the_trainers_offload_before_the_wake_counts_in_the_cycle_it_started():
    """Without the overlapped wake the executor books the offload as switch overhead during the sync,
    and the finished sync clears it: the cycle's measured idle still has it, with the onload after the
    hybrids slept."""
    policy = make_adaptive()
    ctx = production_bound()
    assert policy.should_activate_after_step(8, False, ctx) is True
    predicted = policy.predicted_idle_s
    ctx.last_activate_duration_s, ctx.last_switch_overhead_s = 2.0, 15.0  # the wake + sync; the offload
    policy.update_after_step(8, ctx)
    policy.deactivate_wait_samples(ctx)
    after = production_bound()
    after.last_deactivate_duration_s, after.last_switch_overhead_s = 1.0, 15.0  # the sleep; the onload
    policy.should_activate_after_step(12, False, after)
    assert policy.idle_bias_by_level["activate@0"] == pytest.approx(2.0 + 15.0 + 1.0 + 15.0 - predicted)


def test_an_activation_measured_better_than_predicted_does_not_argue_for_switching_before_a_static_cycle():
    """The error may be the model's rates, which would make its static prediction just as wrong: until a
    static cycle is measured a negative activation correction is kept (and audited), not applied."""
    policy = make_adaptive()
    _activate_and_sync(policy)
    policy.should_activate_after_step(12, False, production_bound())  # measured: 2 s against ~17 predicted
    assert policy.idle_bias_by_level["activate@0"] < -10.0
    assert policy.last_decision["idle_bias_s"]["activate"] == 0.0
    policy.idle_bias_cycles["stay"] = 1  # a static cycle measured: the correction applies
    policy.predicted_idle_s = -1.0
    policy.should_activate_after_step(16, False, production_bound())
    assert policy.last_decision["idle_bias_s"]["activate"] < -10.0


def test_no_correction_predicts_a_switching_cycle_idling_less_than_its_own_switches_or_any_cycle_below_zero():
    """A first decision taken on rates not yet settled can measure an error of hundreds of seconds; taken
    whole, it argued for switching long after the rates were right. The trainer idles at least through
    its measured switches in a cycle that switches, and never less than nothing in one that stays."""
    policy = make_adaptive()
    policy.activate_cost_s, policy.deactivate_cost_s = 10.0, 12.0
    policy.idle_bias_by_level.update({"activate@0": -700.0, "stay@0": -500.0})
    policy.idle_bias_cycles["stay"] = 1
    assert policy.should_activate_after_step(8, False, production_bound()) is False
    assert policy.last_decision["corrected_gain_s"] == pytest.approx(0.0 - 22.0)


def test_a_switch_that_measured_as_predicted_changes_nothing():
    policy = make_adaptive()
    _activate_and_sync(policy)
    predicted = policy.predicted_idle_s
    ctx = production_bound()
    ctx.last_deactivate_wait_s = predicted - 2.0  # the activation's 2 s measured at the sync before
    assert policy.should_activate_after_step(12, False, ctx) is True
    assert policy.last_decision["idle_bias_s"]["activate"] == pytest.approx(0.0, abs=1e-3)


def test_kept_asleep_only_by_the_measured_error_it_re_measures_after_ever_longer_waits():
    policy = make_adaptive()
    policy.idle_bias_by_level["activate@0"] = 1000.0  # production_bound's queue (10) is level 0
    decisions = []
    for step in range(1, 300):
        decisions.append(policy.should_activate_after_step(4 * step, False, production_bound()))
        policy.predicted_idle_s = -1.0  # no cycle measured in between: the bias stays
    retries = [index for index, activated in enumerate(decisions) if activated]
    gaps = [later - earlier for earlier, later in zip(retries, retries[1:], strict=False)]
    assert retries[0] == RETRY_EVERY - 1
    assert gaps[:3] == [2 * RETRY_EVERY, 4 * RETRY_EVERY, RETRY_MAX] and set(gaps[3:]) == {RETRY_MAX}


def test_an_activation_on_the_models_merit_restarts_the_re_measuring_at_its_shortest_wait():
    policy = make_adaptive()
    policy.retry_after = RETRY_MAX
    assert policy.should_activate_after_step(8, False, production_bound()) is True  # nothing corrected: go
    assert policy.retry_after == RETRY_EVERY


def test_after_activating_every_cycle_it_stays_asleep_once_to_measure_the_static_cycle():
    policy = make_adaptive()
    for step in range(1, FIRST_STAY_AFTER + 1):
        assert policy.should_activate_after_step(4 * step, False, production_bound()) is True
        policy.predicted_idle_s = -1.0  # no cycle measured in between
    # No static cycle measured yet: an early check.
    assert policy.should_activate_after_step(100, False, production_bound()) is False
    assert "re-measuring the static cycle" in policy.last_decision["why"]
    policy.predicted_idle_s = -1.0
    policy.idle_bias_cycles["stay"] = 1  # once a static cycle has been measured, only every RETRY_EVERY
    later = []
    for step in range(30, 70):
        later.append(policy.should_activate_after_step(4 * step, False, production_bound()))
        policy.predicted_idle_s = -1.0
    assert later.index(False) == RETRY_EVERY


def test_static_checks_the_next_decision_overrules_come_ever_less_often_and_a_confirmed_one_restarts_them():
    policy = make_adaptive()
    policy.idle_bias_cycles["stay"] = 1  # a static cycle was measured: checks every RETRY_EVERY activations
    decisions = []
    for step in range(1, 250):
        decisions.append(policy.should_activate_after_step(4 * step, False, production_bound()))
        policy.predicted_idle_s = -1.0
    checks = [index for index, activated in enumerate(decisions) if not activated]
    gaps = [later - earlier for earlier, later in zip(checks, checks[1:], strict=False)]
    assert checks[0] == RETRY_EVERY  # after RETRY_EVERY activations in a row
    # every check was overruled (the next cycle activated again): twice as many activations before the next
    assert gaps[:3] == [2 * RETRY_EVERY + 1, 4 * RETRY_EVERY + 1, RETRY_MAX + 1]
    assert set(gaps[3:]) == {RETRY_MAX + 1}
    # a check the next decision confirms (it stays asleep on the model) brings the checks back to RETRY_EVERY
    policy.activations_in_row = policy.stay_after
    assert policy.should_activate_after_step(1000, False, production_bound()) is False  # the check
    consumption_bound = production_bound(surplus=30, samples_per_replica_s=3.0,
                                         standalone_samples_per_replica_s=3.0)
    assert policy.should_activate_after_step(1004, False, consumption_bound) is False
    assert policy.stay_after == RETRY_EVERY


def test_a_static_cycle_measured_far_better_than_predicted_stops_useless_activations():
    policy = make_adaptive()
    for step in range(1, FIRST_STAY_AFTER + 1):
        assert policy.should_activate_after_step(4 * step, False, production_bound()) is True
        policy.predicted_idle_s = -1.0
    assert policy.should_activate_after_step(40, False, production_bound()) is False  # the check
    ctx = production_bound()
    ctx.step_wait_times = [0.0, 0.0, 0.0, 0.0]  # the static cycle did not wait at all
    assert policy.should_activate_after_step(44, False, ctx) is False
    assert policy.last_decision["idle_bias_s"]["stay"] < 0


def test_a_queue_that_already_holds_the_planned_wait_never_activates_whatever_the_measured_error():
    policy = make_adaptive()
    policy.idle_bias_by_level["stay@2"] = 1000.0  # static cycles measured far worse than predicted
    ctx = production_bound(surplus=40)
    assert policy.should_activate_after_step(8, False, ctx) is False
    assert policy.last_decision["wait_for_samples"] <= 40


def test_a_free_switch_is_a_measurement_of_zero_not_an_unmeasured_one():
    policy = make_adaptive()
    ctx = production_bound()
    assert policy.should_activate_after_step(8, False, ctx) is True
    policy.update_after_step(8, ctx)  # the activation measured 0 s
    policy.deactivate_wait_samples(ctx)
    policy.update_after_step(12, ctx)  # so did the deactivation
    assert policy.switch_cost_s(ctx) == 0.0


def test_a_state_saved_before_zero_costs_counted_restores_its_zeros_as_unmeasured():
    old_state = {k: v for k, v in make_adaptive().state_dict().items() if k != "switched"}
    old_state["activate_cost_s"], old_state["deactivate_cost_s"] = 0.0, 3.0
    policy = make_adaptive()
    policy.load_state_dict(old_state)
    assert (policy.activate_cost_s, policy.deactivate_cost_s) == (-1.0, 3.0)


def test_a_switch_that_measured_far_worse_at_one_queue_level_keeps_only_that_level_asleep():
    policy = make_adaptive()
    _activate_and_sync(policy)  # at level 0: the queue (10) cannot feed a micro-step (16)
    level_1 = production_bound(surplus=20)
    level_1.last_deactivate_wait_s = policy.predicted_idle_s - 2.0  # the level-0 cycle measured as predicted
    assert policy.should_activate_after_step(12, False, level_1) is True
    assert policy.last_decision["queue_level"] == 1
    policy.update_after_step(12, level_1)
    policy.deactivate_wait_samples(level_1)
    level_1 = production_bound(surplus=20)
    level_1.last_deactivate_wait_s = 60.0  # the level-1 activation measured far worse than predicted
    assert policy.should_activate_after_step(16, False, level_1) is False
    assert policy.last_decision["idle_bias_s"]["activate"] > 40.0
    level_0 = production_bound()
    level_0.step_wait_times = [policy.predicted_idle_s]  # the static cycle idled as predicted
    assert policy.should_activate_after_step(20, False, level_0) is True  # level 0 measured fine
    assert policy.last_decision["queue_level"] == 0
    assert policy.last_decision["idle_bias_s"]["activate"] == pytest.approx(0.0, abs=1e-3)


def test_a_stay_measured_far_worse_at_a_full_queue_does_not_correct_a_stay_at_an_empty_one():
    policy = make_adaptive()
    full = production_bound(surplus=40)  # level 2: the queue feeds two micro-steps
    assert policy.should_activate_after_step(8, False, full) is False
    after_full = production_bound()  # level 0 next
    after_full.step_wait_times = [policy.predicted_idle_s + 60.0]  # the stay idled 60 s more than predicted
    policy.should_activate_after_step(12, False, after_full)
    assert policy.idle_bias_by_level["stay@2"] == pytest.approx(60.0)
    assert policy.last_decision["queue_level"] == 0
    assert policy.last_decision["idle_bias_s"]["stay"] == 0.0  # level 0 not measured: the model as it is


def test_a_cycle_kept_asleep_measures_the_rate_of_its_first_wait_for_the_static_prediction():
    policy = make_adaptive()
    full = production_bound(surplus=40)
    assert policy.should_activate_after_step(8, False, full) is False
    measured = production_bound()
    measured.step_wait_samples, measured.step_wait_times = [16, 0, 0, 0], [2.0, 0.0, 0.0, 0.0]
    policy.should_activate_after_step(12, False, measured)
    assert policy.static_first_fill == [16.0, 2.0]  # 16 samples in 2 s
    assert policy.last_decision["first_wait_samples_per_s"] == 8.0
    assert policy.last_decision["static_idle_s"] == pytest.approx(
        cycle_queue(queued=10, rate=1.5, required=16, micro_steps=4, train_s=6.0, first_rate=8.0).idle_s)


def test_one_stay_that_idles_far_past_the_others_neither_sets_the_stay_correction_nor_the_first_wait_rate():
    policy = make_adaptive()
    policy.idle_bias_by_level["stay@2"], policy.idle_error_var_by_level["stay@2"] = 0.0, 4.0
    assert policy.should_activate_after_step(8, False, production_bound(surplus=40)) is False
    predicted = policy.predicted_idle_s
    long_wait = production_bound()  # the version waited 100 s for one very long response
    long_wait.step_wait_samples, long_wait.step_wait_times = [16, 0, 0, 0], [predicted + 100.0, 0.0, 0.0, 0.0]
    policy.should_activate_after_step(12, False, long_wait)
    assert policy.idle_bias_by_level["stay@2"] == pytest.approx(0.3 * 6.0)  # moved as if 3 sigma off
    assert policy.idle_error_var_by_level["stay@2"] > 100.0  # the margin widens by all of it
    assert policy.static_first_fill == [0.0, 0.0]  # its wait is not pooled


def test_first_waits_for_a_few_samples_do_not_set_the_first_wait_rate_alone():
    policy = make_adaptive()
    assert policy.should_activate_after_step(8, False, production_bound(surplus=40)) is False
    one_sample = production_bound(surplus=15)
    one_sample.step_wait_samples, one_sample.step_wait_times = [1, 0, 0, 0], [12.0, 0.0, 0.0, 0.0]
    policy.should_activate_after_step(12, False, one_sample)  # mostly the collection, not production
    assert policy.last_decision["first_wait_samples_per_s"] == 0.0  # not a micro-step's worth yet


def test_errors_that_stray_far_from_their_mean_keep_a_small_corrected_gain_from_switching():
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, production_bound())
    gain = policy.last_decision["corrected_gain_s"]
    assert gain > policy.last_decision["min_gain_s"]  # uncorrected and unmeasured: activate
    steady, noisy = make_adaptive(), make_adaptive()
    for policy in (steady, noisy):
        policy.idle_bias_by_level["stay@0"] = policy.idle_bias_by_level["activate@0"] = 0.0
    steady.idle_error_var_by_level["activate@0"] = 0.0
    noisy.idle_error_var_by_level["activate@0"] = (4 * gain) ** 2  # one cycle strays 4 gains from the mean
    assert steady.should_activate_after_step(8, False, production_bound()) is True
    assert noisy.should_activate_after_step(8, False, production_bound()) is False
    assert noisy.last_decision["uncertainty_s"] > gain


def test_an_activation_at_a_queue_level_not_tried_yet_takes_the_least_extra_cost_measured_at_the_others():
    policy = make_adaptive()
    _activate_and_sync(policy)  # at level 0
    ctx = production_bound()
    ctx.last_deactivate_wait_s = 60.0  # the level-0 activation measured far worse than predicted
    policy.should_activate_after_step(12, False, ctx)
    level_0_error = policy.idle_bias_by_level["activate@0"]
    policy.predicted_idle_s = -1.0
    assert policy.should_activate_after_step(16, False, production_bound(surplus=20)) is False
    assert policy.last_decision["queue_level"] == 1
    assert policy.last_decision["idle_bias_s"]["activate"] == pytest.approx(level_0_error)
    assert policy.last_decision["idle_bias_s"]["stay"] == 0.0  # a stay's error never carries over


def test_a_switch_measured_as_predicted_at_one_level_leaves_an_untried_level_uncorrected():
    policy = make_adaptive()
    policy.idle_bias_by_level.update({"activate@0": 50.0, "activate@2": -5.0})
    policy.idle_error_count_by_level.update({"activate@0": 3, "activate@2": 3})
    policy.should_activate_after_step(8, False, production_bound(surplus=20))
    assert policy.last_decision["queue_level"] == 1
    assert policy.last_decision["idle_bias_s"]["activate"] == 0.0


def test_a_correction_measured_once_counts_its_own_size_as_its_uncertainty():
    once, thrice = make_adaptive(), make_adaptive()
    for policy, count in ((once, 1), (thrice, 3)):
        policy.idle_bias_by_level["activate@0"], policy.idle_error_var_by_level["activate@0"] = 20.0, 0.0
        policy.idle_error_count_by_level["activate@0"] = count
        policy.should_activate_after_step(8, False, production_bound())
    expected = standard_error(20.0 ** 2, weight=0.3)
    assert once.last_decision["uncertainty_s"] == pytest.approx(expected, abs=1e-3)
    assert thrice.last_decision["uncertainty_s"] == 0.0  # three cycles that all erred by 20 s


def test_the_measured_corrections_grow_with_the_cycles_training_time_when_samples_lengthen():
    policy = make_adaptive()
    policy.should_activate_after_step(8, False, production_bound())  # the corrections' unit: 6 s micro-steps
    policy.predicted_idle_s = -1.0  # nothing to credit: only the stored corrections are compared
    policy.idle_bias_by_level.update({"activate@0": 20.0, "stay@0": -4.0})
    policy.idle_error_var_by_level["activate@0"] = 9.0
    policy.should_activate_after_step(9, False, production_bound(trainer_s_per_micro_step=12.0))
    assert policy.last_decision["idle_bias_s"] == {"stay": -8.0, "activate": 40.0}
    assert policy.idle_error_var_by_level["activate@0"] == pytest.approx(36.0)
