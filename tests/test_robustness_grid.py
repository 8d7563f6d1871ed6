"""The robustness-grid bench (bench/robustness_grid.py): its points change what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.robustness_grid import grid, point, summary_line
from sim.scenario import load_scenario

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim_16_16_adaptive.yaml"


@pytest.mark.parametrize(("name", "size"),
                         [("workload", 36), ("switch_costs", 36), ("trigger", 16), ("shape", 16),
                          ("concurrency", 21)])
def test_every_point_of_a_grid_is_a_valid_change_of_the_config(name: str, size: int) -> None:
    points = grid(name)
    assert len(points) == size and len({tuple(sorted(p.items())) for p in points}) == size
    for changes in points:
        load_scenario(CONFIG).with_changes(changes)  # raises on an unknown key or a bad value


def test_the_random_grid_draws_valid_changes_of_every_axis_the_same_way_for_a_seed() -> None:
    points = grid("random", points=12, seed=3)
    assert points == grid("random", points=12, seed=3) != grid("random", points=12, seed=4)
    assert len(points) == 12 and all(p["rollout.sim.sleep_s"] == p["rollout.sim.wake_s"] for p in points)
    for changes in points:
        load_scenario(CONFIG).with_changes(changes)


def test_a_switch_point_prices_the_switches_it_names() -> None:
    changes = {"rollout.sim.wake_s": 30.0, "rollout.sim.sleep_s": 30.0, "trainer.offload_s": 0.0,
               "rollout.sim.weight_sync_s": 2.0, "trainer.time_per_sample_s": 26.0}
    costs = load_scenario(CONFIG).with_changes(changes).costs
    assert (costs.hybrid_wake_s, costs.hybrid_sleep_s, costs.standalone_sync_s) == (30.0, 30.0, 2.0)


def test_a_point_compares_the_policy_with_static_on_the_same_workload() -> None:
    row = point(CONFIG, "static", 160, {"trainer.time_per_sample_s": 13.0})
    assert row["static_s"] == row["policy_s"] and row["vs_static"] == 0.0


def test_a_point_at_zero_prompts_runs_the_config_at_its_own_length() -> None:
    own = load_scenario(CONFIG).config.data.total_rollout_steps
    changes = {"trainer.time_per_sample_s": 13.0}
    own_length_s = point(CONFIG, "static", 0, changes)["static_s"]
    assert own_length_s == point(CONFIG, "static", own, changes)["static_s"]
    assert own_length_s != point(CONFIG, "static", 160, changes)["static_s"]


def test_the_summary_names_the_worst_point_and_counts_the_misses() -> None:
    rows = [{"a.b": 1.0, "vs_static": 0.02}, {"a.b": 2.0, "vs_static": -0.1},
            {"a.b": 3.0, "vs_static": 0.005}]
    line = summary_line(Path("x.yaml"), rows)
    assert line == ("x: worst +2.0% at b=1; mean -2.5%; 1 of 3 points over +1% (0 of them the start-up "
                    "activation alone)")


def test_the_summary_counts_the_misses_whose_one_switch_was_the_start_up_activation() -> None:
    rows = [{"a.b": 1.0, "vs_static": 0.03, "start_up_only": True},
            {"a.b": 2.0, "vs_static": 0.02, "start_up_only": False},
            {"a.b": 3.0, "vs_static": -0.01, "start_up_only": True}]
    assert summary_line(Path("x.yaml"), rows).endswith("2 of 3 points over +1% (1 of them the start-up "
                                                       "activation alone)")


def test_a_point_says_whether_its_one_switch_was_the_blind_start_up_activation() -> None:
    slow_trainer = {"rollout.sim.wake_s": 30.0, "rollout.sim.sleep_s": 30.0,
                    "trainer.time_per_sample_s": 60.0}
    once = point(CONFIG, "adaptive", 320, slow_trainer)  # the queue never runs dry after the start-up
    assert once["activations"] == 1 and once["start_up_only"] is True
    fast_trainer = {**slow_trainer, "trainer.time_per_sample_s": 6.0}
    assert point(CONFIG, "adaptive", 320, fast_trainer)["start_up_only"] is False  # it switches again
    assert point(CONFIG, "static", 160, {})["start_up_only"] is False


def test_a_point_over_several_workload_draws_is_the_mean_of_each_draws_ratio_with_its_range() -> None:
    changes = {"trainer.time_per_sample_s": 13.0}
    seed = load_scenario(CONFIG).seed
    one = [point(CONFIG, "adaptive", 160, {**changes, "run.seed": seed + i}) for i in range(2)]
    both = point(CONFIG, "adaptive", 160, changes, workload_seeds=2)
    assert one[0]["vs_static"] != one[1]["vs_static"]  # two different draws
    assert both["vs_static"] == pytest.approx((one[0]["vs_static"] + one[1]["vs_static"]) / 2)
    assert both["vs_static_spread"] == pytest.approx(abs(one[0]["vs_static"] - one[1]["vs_static"]))
    assert both["static_s"] == pytest.approx((one[0]["static_s"] + one[1]["static_s"]) / 2)
    assert point(CONFIG, "adaptive", 160, changes)["vs_static_spread"] == 0.0
