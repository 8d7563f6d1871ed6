"""Pure tests of rollouter flow control (core/flow.py), numbers computed by hand."""

from __future__ import annotations

import pytest

from core.flow import FlowLimits, StalenessTracker, total_rollout_steps


def make_limits(
    *,
    ppo_mini_batch_size: int = 32,
    require_batches: int = 1,
    trigger_parameter_sync_step: int = 4,
    staleness_threshold: float = 0.1,
    total_rollout_steps: int = 1000,
) -> FlowLimits:
    return FlowLimits(
        ppo_mini_batch_size=ppo_mini_batch_size,
        require_batches=require_batches,
        trigger_parameter_sync_step=trigger_parameter_sync_step,
        staleness_threshold=staleness_threshold,
        total_rollout_steps=total_rollout_steps,
    )


def test_limits_follow_the_original_formulas() -> None:
    limits = make_limits()
    assert limits.required_samples == 32  # 32 * 1
    assert limits.step_required == 128  # 32 * 4
    assert limits.max_required == 140  # int(32 * 1.1 * 4) = int(140.8)
    assert limits.max_queue_size == 140
    assert limits.total_train_steps == 7  # int(1000 / 128)


def test_require_batches_multiplies_required_and_staleness_zero_is_synchronous() -> None:
    limits = make_limits(ppo_mini_batch_size=8, require_batches=2, trigger_parameter_sync_step=2,
                         staleness_threshold=0)
    assert limits.required_samples == 16
    assert limits.step_required == 32
    assert limits.max_required == 32


def test_max_concurrent_is_capped_by_replicas_and_by_max_required() -> None:
    limits = make_limits()
    assert limits.max_concurrent(2, 16) == 32
    assert limits.max_concurrent(16, 16) == 140
    assert limits.max_concurrent(0, 16) == 0  # only_hybrid with every hybrid asleep


def test_active_hybrids_count_their_own_samples_in_flight_when_the_config_gives_them() -> None:
    limits = make_limits()
    # 2 standalones x 16 + 2 active hybrids x 8 (the replicas past the standalones are hybrids)
    assert limits.max_concurrent(4, 16, standalone_replicas=2, hybrid_concurrent_samples_per_replica=8) == 48
    assert limits.max_concurrent(2, 16, standalone_replicas=2, hybrid_concurrent_samples_per_replica=8) == 32
    assert limits.max_concurrent(4, 16, standalone_replicas=2) == 64  # not given: the seed's formula
    assert limits.max_concurrent(2, 16, standalone_replicas=0, hybrid_concurrent_samples_per_replica=8) == 16
    assert limits.max_concurrent(16, 16, standalone_replicas=2,
                                 hybrid_concurrent_samples_per_replica=8) == 140  # capped at max_required


def test_total_rollout_steps_is_the_smaller_of_config_and_dataset_epochs() -> None:
    assert total_rollout_steps(configured=100, dataset_size=30, total_epochs=2) == 60
    assert total_rollout_steps(configured=50, dataset_size=30, total_epochs=2) == 50


@pytest.mark.parametrize(
    "field,value",
    [
        ("ppo_mini_batch_size", 0),
        ("require_batches", 0),
        ("trigger_parameter_sync_step", 0),
        ("staleness_threshold", -0.1),
        ("total_rollout_steps", -1),
    ],
)
def test_bad_limits_are_value_errors(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        make_limits(**{field: value})  # type: ignore[arg-type]


def test_bad_max_concurrent_inputs_are_value_errors() -> None:
    with pytest.raises(ValueError):
        make_limits().max_concurrent(-1, 16)
    with pytest.raises(ValueError):
        make_limits().max_concurrent(1, 0)
    with pytest.raises(ValueError, match="hybrid_concurrent_samples_per_replica"):
        make_limits().max_concurrent(4, 16, standalone_replicas=2, hybrid_concurrent_samples_per_replica=0)


def test_rollouter_pauses_when_staleness_reaches_max_required() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    for _ in range(139):
        tracker.on_submit()
    assert tracker.should_pause(queue_size=0) is False
    tracker.on_submit()  # 140 = max_required
    assert tracker.should_pause(queue_size=0) is True


def test_rollouter_pauses_when_the_queue_reaches_max_queue_size() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    assert tracker.should_pause(queue_size=139) is False
    assert tracker.should_pause(queue_size=140) is True


def test_pause_latches_until_the_monitor_sees_the_condition_clear() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    assert tracker.check_pause(queue_size=140) is True
    # Still paused even though the queue shrank: only the monitor un-pauses.
    assert tracker.check_pause(queue_size=10) is True
    assert tracker.try_resume(queue_size=140) is False
    assert tracker.try_resume(queue_size=10) is True
    assert tracker.paused is False
    assert tracker.try_resume(queue_size=10) is False


def test_reset_unpauses_and_carries_in_flight_plus_queued_as_staleness() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    for _ in range(140):
        tracker.on_submit()
    assert tracker.check_pause(queue_size=0) is True
    report = tracker.reset(num_active=5, queue_size=20, now_s=1.0)
    assert tracker.paused is False
    assert tracker.staleness_samples == 25
    assert report.staleness_samples == 25
    # Next version may start 140 - 25 = 115 new samples before pausing again.
    for _ in range(114):
        tracker.on_submit()
    assert tracker.should_pause(queue_size=0) is False
    tracker.on_submit()
    assert tracker.should_pause(queue_size=0) is True


def test_completed_steps_start_at_one_and_grow_only_when_the_version_generated_samples() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    assert tracker.completed_steps == 1
    assert tracker.reset(num_active=0, queue_size=0, now_s=1.0).completed_steps == 1
    tracker.on_generated(3)
    report = tracker.reset(num_active=0, queue_size=0, now_s=2.0)
    assert report.completed_steps == 2
    assert report.step_generated_samples == 3
    assert tracker.step_generated == 0
    assert tracker.total_generated == 3


def test_dropped_samples_are_counted_and_not_generated() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=0.0)
    tracker.on_dropped()
    tracker.on_dropped(2)
    assert tracker.dropped == 3
    assert tracker.total_generated == 0
    with pytest.raises(ValueError):
        tracker.on_dropped(-1)


def test_idle_ratio_uses_the_last_idle_window_as_the_original() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=100.0)
    tracker.on_idle_start(106.0)
    report = tracker.reset(num_active=0, queue_size=0, now_s=110.0)
    assert report.version_time_s == pytest.approx(10.0)
    assert report.active_time_s == pytest.approx(6.0)
    assert report.idle_ratio == pytest.approx(0.4)
    assert report.idle_ratio_all_windows == pytest.approx(0.4)


def test_idle_ratio_all_windows_counts_every_idle_window_of_the_version() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=100.0)
    tracker.on_idle_start(102.0)
    tracker.on_idle_end(104.0)
    tracker.on_idle_start(108.0)
    report = tracker.reset(num_active=0, queue_size=0, now_s=110.0)
    assert report.idle_ratio == pytest.approx(0.2)  # 1 - (108-100)/10: only the last window
    assert report.idle_time_s == pytest.approx(4.0)  # 2 + 2
    assert report.idle_ratio_all_windows == pytest.approx(0.4)


def test_an_idle_window_from_a_previous_version_does_not_count_in_the_next() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=100.0)
    tracker.on_idle_start(108.0)
    tracker.reset(num_active=0, queue_size=0, now_s=110.0)
    report = tracker.reset(num_active=0, queue_size=0, now_s=115.0)
    assert report.version_time_s == pytest.approx(5.0)
    assert report.idle_ratio == 0.0
    assert report.idle_ratio_all_windows == 0.0


def test_a_version_of_zero_length_has_idle_ratio_zero() -> None:
    tracker = StalenessTracker(limits=make_limits(), now_s=5.0)
    report = tracker.reset(num_active=0, queue_size=0, now_s=5.0)
    assert report.idle_ratio == 0.0
    assert report.idle_ratio_all_windows == 0.0

