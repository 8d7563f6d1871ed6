"""The schedule-ceiling bench (bench/schedule_ceiling.py): its fixed schedules mean what they say."""

from __future__ import annotations

from pathlib import Path

from bench.schedule_ceiling import ACTIVATE_BELOW, DEACTIVATE_AT, ceiling, format_grid, threshold_policy
from sim.run import simulate
from sim.scenario import load_scenario

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim_16_16_adaptive.yaml"


def test_a_schedule_that_never_activates_runs_exactly_as_static() -> None:
    base = load_scenario(CONFIG).with_prompts(320)
    static = simulate(base.with_policy("static"))
    never = simulate(base.with_policy(threshold_policy(0.0, 1.0)))
    assert never.activations == 0
    assert never.wall_s == static.wall_s


def test_a_schedule_that_always_activates_lends_the_hybrids_at_every_sync_while_prompts_are_fed() -> None:
    base = load_scenario(CONFIG).with_prompts(320)
    always = simulate(base.with_policy(threshold_policy(float("inf"), 1.0)))
    assert always.activations == always.versions  # the startup sync's included, the last one's not


def test_the_best_fixed_schedule_is_the_fastest_grid_point_and_free_switches_cost_it_at_most_a_point():
    base = load_scenario(CONFIG).with_prompts(320)
    result = ceiling(base, policy="adaptive", seeds=[0], free_switches=True)
    rows = result["rows"]
    best = rows["best fixed schedule, as configured"]
    static_s = result["static_s"][0]
    for a in ACTIVATE_BELOW[::2]:
        for x in DEACTIVATE_AT[::2]:
            point = simulate(base.with_changes({"run.seed": 0}).with_policy(threshold_policy(a, x)))
            assert best["vs_static"] <= point.wall_s / static_s - 1.0 + 1e-12
    assert rows["best fixed schedule, free switches"]["vs_static"] <= best["vs_static"] + 0.01
    assert set(rows) == {"policy", "policy, free switches", "best fixed schedule, as configured",
                         "best fixed schedule, free switches"}


def test_the_grid_table_has_a_row_per_activation_threshold_and_a_column_per_deactivation_threshold() -> None:
    grid = [{"vs_static": index / 1000} for index in range(len(ACTIVATE_BELOW) * len(DEACTIVATE_AT))]
    lines = format_grid(grid).splitlines()
    assert len(lines) == 1 + len(ACTIVATE_BELOW)
    assert lines[1].split()[0] == "1" and lines[-1].split()[0] == "always"
    second_row = lines[2].split()[1:]
    assert second_row[0] == f"{100 * len(DEACTIVATE_AT) / 1000:+.1f}%"  # A 1.5, X 0: the 7th point
    assert len(second_row) == len(DEACTIVATE_AT)
