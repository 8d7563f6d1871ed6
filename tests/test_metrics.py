"""Pure unit tests of the section-4 metric formulas on hand-computed event histories (core/metrics.py)."""

from __future__ import annotations

import pytest

from core.metrics import (
    CLUSTER_UTIL,
    MQ_SIZE,
    ROLLOUT_UTIL,
    SAMPLE_LAG_MEAN,
    TRAIN_ALLOC,
    TRAIN_COMPUTE,
    TRAIN_UTIL,
    TRAINER_IDLE,
    CycleAggregator,
    UtilizationHistory,
    cluster_resource_utilization,
    partial_rollout_stats,
    processing_time_stats,
    reduction_for,
    rollout_resource_utilization,
    sample_lag_mean,
    stale_trajectory_count,
    train_compute_time_s,
    train_resource_utilization,
    trainer_idle_ratio,
)

# ---- train side ----


def test_train_compute_sums_the_seven_compute_keys_and_treats_missing_ones_as_zero():
    timing_raw = {"reward": 1.0, "ref": 2.0, "update_actor": 3.0, "gen": 100.0, "param_sync": 9.0}
    assert train_compute_time_s(timing_raw) == 6.0


def test_train_utilization_is_the_ratio_of_totals_not_the_mean_of_ratios():
    assert train_resource_utilization([1.0, 9.0], [2.0, 30.0]) == pytest.approx(10 / 32)
    assert train_resource_utilization([], []) == 0.0


# ---- rollout side ----


def test_rollout_utilization_with_constant_capacity_weights_intervals_by_duration():
    assert rollout_resource_utilization([(0.0, 2, 4), (10.0, 4, 4)], now=20.0) == pytest.approx(60 / 80)


def test_rollout_utilization_uses_each_intervals_own_capacity_when_it_changes_mid_window():
    # [0,10): 4 of 4 busy; [10,15): 6 of 8 busy -> (40 + 30) / (40 + 40)
    assert rollout_resource_utilization([(0.0, 4, 4), (10.0, 6, 8)], now=15.0) == pytest.approx(70 / 80)


def test_rollout_utilization_counts_at_most_the_capacity_when_more_tasks_are_active():
    assert rollout_resource_utilization([(0.0, 10, 4)], now=5.0) == 1.0


def test_rollout_utilization_skips_zero_capacity_and_zero_length_intervals():
    assert rollout_resource_utilization([(0.0, 0, 0), (5.0, 2, 4), (10.0, 2, 0)],
                                        now=20.0) == pytest.approx(0.5)
    assert rollout_resource_utilization([(0.0, 1, 2), (0.0, 2, 2)], now=4.0) == 1.0


def test_rollout_utilization_is_zero_without_anything_to_integrate():
    assert rollout_resource_utilization([], now=10.0) == 0.0
    assert rollout_resource_utilization([(0.0, 3, 0)], now=10.0) == 0.0
    assert rollout_resource_utilization([(10.0, 3, 4)], now=10.0) == 0.0


def test_history_patches_the_initial_zero_capacity_once_then_closes_and_reseeds():
    history = UtilizationHistory(t0=0.0)
    history.record(2.0, 1, 0)
    history.set_initial_capacity(4)
    history.record(6.0, 3, 8)
    # [0,2): 0/4, [2,6): 1/4, [6,10): 3/8 -> (0 + 4 + 12) / (8 + 16 + 32)
    assert history.close(10.0) == pytest.approx(16 / 56)
    assert history.points == [(10.0, 3, 8)]
    history.set_initial_capacity(100)
    assert history.close(12.0) == pytest.approx(6 / 16)


def test_history_refuses_points_out_of_time_order():
    history = UtilizationHistory(t0=5.0, cap=4)
    with pytest.raises(ValueError):
        history.record(4.0, 1, 4)


# ---- cluster ----


def test_cluster_utilization_splits_hybrid_gpus_by_the_wait_fraction():
    value = cluster_resource_utilization(0.8, 0.6, 30.0, 100.0, num_trainer_gpus=16, num_standalone_gpus=16)
    assert value == pytest.approx((0.7 * 16 * 0.8 + (0.3 * 16 + 16) * 0.6) / 32)


def test_cluster_utilization_clips_the_wait_fraction_and_treats_no_step_time_as_zero():
    assert cluster_resource_utilization(0.8, 0.6, 300.0, 100.0, num_trainer_gpus=16,
                                        num_standalone_gpus=16) == pytest.approx(0.6)  # fmt: skip
    assert cluster_resource_utilization(0.8, 0.6, 5.0, 0.0, num_trainer_gpus=16,
                                        num_standalone_gpus=16) == pytest.approx(0.7)  # fmt: skip
    assert cluster_resource_utilization(0.8, 0.6, 5.0, 10.0, num_trainer_gpus=0, num_standalone_gpus=0) == 0.0


# ---- fully_async ratios and counts ----


def test_trainer_idle_ratio_is_summed_gen_over_summed_step():
    assert trainer_idle_ratio([2.0, 3.0], [10.0, 10.0]) == pytest.approx(0.25)
    assert trainer_idle_ratio([1.0], [0.0]) == 0.0


def test_partial_rollout_stats_count_trajectories_spanning_several_versions():
    stats = partial_rollout_stats([(1, 1), (1, 2), (0, 3), (2, 2)])
    assert stats == {
        "fully_async/partial/total_partial_num": 2.0,
        "fully_async/partial/partial_ratio": 0.5,
        "fully_async/partial/max_partial_span": 3.0,
    }
    assert set(partial_rollout_stats([]).values()) == {0.0}


def test_stale_trajectories_lag_the_current_version_by_at_least_one():
    assert stale_trajectory_count(5, [5, 4, 3, 6]) == 2


def test_processing_time_stats_use_linear_interpolation_percentiles():
    stats = processing_time_stats([5.0, 1.0, 3.0, 2.0, 4.0])
    prefix = "fully_async/processing_time/"
    assert stats[prefix + "avg"] == 3.0 and stats[prefix + "min"] == 1.0 and stats[prefix + "max"] == 5.0
    assert stats[prefix + "tp50"] == pytest.approx(3.0)
    assert stats[prefix + "tp95"] == pytest.approx(4.8)
    assert stats[prefix + "tp99"] == pytest.approx(4.96)
    assert processing_time_stats([]) == {}


# ---- aggregation ----


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        (MQ_SIZE, "last"),
        ("fully_async/count/total_generated_samples", "last"),
        ("training/global_step", "last"),
        (TRAIN_COMPUTE, "sum"),
        ("timing_s/wait_for_enough_samples", "sum"),
        ("timing_s/max_something", "sum"),
        ("actor/entropy_mean", "mean"),
        ("fully_async/partial/max_partial_span", "max"),
        ("response_length/min", "min"),
        ("fully_async/partial/total_partial_num", "sum"),
        ("fully_async/partial/partial_ratio", "mean"),
    ],
)
def test_reduction_rules_follow_fixed_keys_then_name_order(key, rule):
    assert reduction_for(key) == rule


def test_cycle_aggregator_reduces_a_cycle_and_derives_ratios_from_totals():
    agg = CycleAggregator()
    agg.add({TRAIN_COMPUTE: 1.0, TRAIN_ALLOC: 2.0, MQ_SIZE: 7, "timing_s/step": 50.0, "timing_s/gen": 10.0,
             "timing_s/wait_for_enough_samples": 20.0, "actor/loss": 1.0, "note": "ignored"})  # fmt: skip
    agg.add({TRAIN_COMPUTE: 9.0, TRAIN_ALLOC: 30.0, MQ_SIZE: 3, "timing_s/step": 50.0, "timing_s/gen": 15.0,
             "actor/loss": 3.0})  # fmt: skip
    out = agg.reduce(rollout_utilization=0.6, num_trainer_gpus=8, num_standalone_gpus=8)
    assert out[MQ_SIZE] == 3.0
    assert out["actor/loss"] == 2.0
    assert out[TRAIN_UTIL] == pytest.approx(10 / 32)
    assert out[TRAINER_IDLE] == pytest.approx(0.25)
    assert out[ROLLOUT_UTIL] == 0.6
    assert out[CLUSTER_UTIL] == pytest.approx((0.8 * 8 * (10 / 32) + (0.2 * 8 + 8) * 0.6) / 16)
    assert "note" not in out
    agg.reset()
    assert len(agg) == 0 and agg.reduce() == {}


def test_cycle_aggregator_omits_utilizations_without_their_inputs():
    agg = CycleAggregator()
    agg.add({"fully_async/rollouter/step_generated_samples": 12})
    out = agg.reduce(rollout_utilization=0.5, num_trainer_gpus=8, num_standalone_gpus=8)
    assert out == {"fully_async/rollouter/step_generated_samples": 12.0}


def test_a_samples_lag_counts_from_its_oldest_trajectorys_first_tokens_and_is_averaged_per_cycle():
    # trained at version 5: one sample all from 5, one started at 3 (a trajectory resumed at 4), one from 4
    assert sample_lag_mean(5, [5, 3, 4]) == pytest.approx((0 + 2 + 1) / 3)
    assert sample_lag_mean(5, []) == 0.0
    assert reduction_for(SAMPLE_LAG_MEAN) == "mean"
