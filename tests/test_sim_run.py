"""Whole-loop tests of the simulator on small scenarios (each runs in well under a second)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.cli import main as cli_main
from sim.plan import format_table, plan, recommend
from sim.run import Simulation, flow_limits, simulate
from sim.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
POLICIES = ("static", "default", "fixed_ratio", "static_fully_async")


def small(kind: str, prompts: int = 640) -> Scenario:
    return load_scenario(SCENARIOS / f"small_{kind}_bound.yaml").with_prompts(prompts)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", ["production", "consumption"])
def test_every_fed_sample_is_generating_queued_trained_or_dropped(kind: str, policy: str) -> None:
    scenario = small(kind).with_policy(policy)
    res = simulate(scenario)
    s = res.samples
    assert s["fed"] == s["generating"] + s["queued"] + s["trained"] + s["dropped"]
    limits = flow_limits(scenario)
    assert s["trained"] == limits.total_train_steps * limits.step_required
    assert s["fed"] <= scenario.async_training.total_rollout_steps


def test_the_same_seed_gives_the_same_run_and_another_seed_does_not() -> None:
    scenario = small("production").with_policy("default")
    a, b = simulate(scenario), simulate(scenario)
    assert a.wall_s == b.wall_s
    assert a.cycles == b.cycles
    assert a.mq_series == b.mq_series
    other = simulate(scenario.with_seed(scenario.seed + 1))
    assert other.wall_s != a.wall_s


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("split", [(8, 24), (16, 16), (24, 8)])
def test_no_run_beats_the_ideal_lower_bound(policy: str, split: tuple[int, int]) -> None:
    for kind in ("production", "consumption"):
        res = simulate(small(kind, prompts=384).with_split(*split).with_policy(policy))
        assert res.wall_s >= res.ideal_bound_s > 0


def test_production_bound_static_queue_hugs_zero_and_the_trainer_starves() -> None:
    res = simulate(small("production", prompts=1280).with_policy("static"))
    mq = [q for _, q in res.mq_series]
    cap = flow_limits(small("production")).max_queue_size
    assert sum(mq) / len(mq) <= 0.03 * cap
    idle = [c["fully_async/trainer/idle_ratio"] for c in res.cycles[1:]]
    assert sum(idle) / len(idle) > 0.5


def test_consumption_bound_static_queue_sits_at_the_staleness_cap() -> None:
    scenario = small("consumption", prompts=1280).with_policy("static")
    limits = flow_limits(scenario)
    res = simulate(scenario)
    # After micro-step k of a cycle the trainer has taken k*required of the max_required samples the
    # staleness budget allows per version; "at capacity" = all the rest is already generated and queued.
    fill = []
    for i, (_, q) in enumerate(res.mq_series[limits.trigger_parameter_sync_step:]):
        k = i % limits.trigger_parameter_sync_step + 1
        fill.append(q / (limits.max_required - k * limits.required_samples))
    assert sum(fill) / len(fill) >= 0.95
    idle = [c["fully_async/trainer/idle_ratio"] for c in res.cycles[1:]]
    assert max(idle) < 0.02


def test_dynamic_scheduling_uses_idle_trainer_gpus_when_rollout_is_the_bottleneck() -> None:
    static = simulate(small("production").with_policy("static"))
    dynamic = simulate(small("production").with_policy("default"))
    assert dynamic.activations > 0
    assert dynamic.wall_s < 0.9 * static.wall_s


def test_gpu_lanes_cover_the_whole_run() -> None:
    res = simulate(small("production", prompts=256).with_policy("default"))
    by_state = res.gpu_seconds_by_state()
    assert sum(by_state.values()) == pytest.approx(res.wall_s * (res.train_gpus + res.rollout_gpus))
    assert by_state["switch"] > 0 and by_state["train"] > 0 and by_state["rollout"] > 0


def test_cli_simulate_writes_json_and_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SCENARIOS / "small_production_bound.yaml")
    code = cli_main(["simulate", "--scenario", path, "--prompts", "256", "--policy", "default",
                     "--compare", "16:16", "--out", str(tmp_path)])
    assert code == 0
    assert "16-16 default" in capsys.readouterr().out
    for name in ("summary.json", "cycles.jsonl", "mq_size.png", "utilization.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert list(tmp_path.glob("resource_time_*.png"))


def test_cli_plan_ranks_splits_and_policies(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SCENARIOS / "small_production_bound.yaml")
    assert cli_main(["plan", "--scenario", path, "--prompts", "256", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "fixed_ratio" in out and "24:8" in out


def test_cli_plan_tries_each_concurrency_multiple_and_names_the_recommended_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SCENARIOS / "small_production_bound.yaml")
    args = ["plan", "--scenario", path, "--prompts", "128", "--workers", "1", "--concurrency", "1,2"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    configured = load_scenario(path).config.async_training.concurrent_samples_per_replica
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 "))]
    assert {row[3] for row in rows} <= {str(configured), str(2 * configured)}
    assert "concurrent_samples_per_replica" in out.splitlines()[-1]


def test_plan_refuses_a_concurrency_multiple_that_is_not_positive(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SCENARIOS / "small_production_bound.yaml")
    with pytest.raises(SystemExit):
        cli_main(["plan", "--scenario", path, "--concurrency", "1,0"])
    assert "concurrency must be positive" in capsys.readouterr().err


def test_the_mean_age_of_trained_samples_is_set_by_the_staleness_limit_not_by_the_samples_in_flight() -> None:
    base = small("consumption")  # the rollouter reaches its staleness limit every version
    configured = base.config.async_training.concurrent_samples_per_replica
    ages = [simulate(base.with_changes({"async_training.concurrent_samples_per_replica": samples})
                     .with_policy(policy))
            for samples in (configured, 2 * configured) for policy in ("static", "adaptive")]
    assert len({round(run.mean_sample_lag(), 9) for run in ages}) == 1
    assert 0 < ages[0].mean_sample_lag() < 1 + base.config.async_training.staleness_threshold
    on_policy = simulate(base.with_changes({"async_training.staleness_threshold": 0.0}).with_policy("static"))
    assert on_policy.mean_sample_lag() < ages[0].mean_sample_lag()
    assert sum(ages[0].sample_lag_versions.values()) == ages[0].samples["trained"]


def test_a_rollouter_that_never_reaches_its_limit_trains_younger_samples() -> None:
    # One rollout replica, its samples in flight the cap: it never starts what the staleness limit allows.
    starved = simulate(small("production").with_split(24, 8, policy="static"))
    full = simulate(small("production").with_split(16, 16, policy="static"))
    assert starved.mean_sample_lag() < full.mean_sample_lag()
    assert starved.summary()["mean_sample_lag_versions"] == round(starved.mean_sample_lag(), 3)


def test_a_plan_over_several_workload_draws_ranks_each_run_by_its_mean_and_shows_the_spread() -> None:
    scenario = small("production").with_prompts(128)
    args: dict[str, Any] = {"policies": ("static", "adaptive"), "concurrency": (1.0,), "workers": 1}
    draws = [plan(scenario.with_seed(scenario.seed + i), **args) for i in range(2)]
    rows = plan(scenario, seeds=2, **args)
    assert len(rows) == len(draws[0])
    for row in rows:
        one = [next(r for r in d if (r.train_gpus, r.policy) == (row.train_gpus, row.policy)) for d in draws]
        assert row.seeds == 2
        assert row.wall_h == pytest.approx((one[0].wall_h + one[1].wall_h) / 2)
        assert row.wall_h_spread == pytest.approx(abs(one[0].wall_h - one[1].wall_h))
    assert [r.wall_h for r in rows] == sorted(r.wall_h for r in rows)
    table = format_table(rows, recommended=recommend(rows))
    assert "spread" in table.splitlines()[0] and "mean over 2 workload draws" in table


def test_a_plan_tries_each_hybrid_concurrency_on_dynamic_runs_only_and_runs_it_as_the_config_option() -> None:
    scenario = small("production").with_prompts(128)
    rows = plan(scenario, policies=("static", "adaptive"), concurrency=(1.0,), hybrid_concurrency=(1.0, 0.5),
                workers=1)
    configured = scenario.config.async_training.concurrent_samples_per_replica
    for train, rollout in {(r.train_gpus, r.rollout_gpus) for r in rows}:
        at_split = [r for r in rows if (r.train_gpus, r.rollout_gpus) == (train, rollout)]
        assert sorted((r.policy, r.hybrid_concurrency or 0) for r in at_split if r.policy == "adaptive") == [
            ("adaptive", 0), ("adaptive", configured // 2)]
        assert all(r.hybrid_concurrency is None for r in at_split if r.policy == "static")
    half = next(r for r in rows if r.policy == "adaptive" and r.hybrid_concurrency and r.train_gpus == 16)
    half_config = {"async_training.hybrid_concurrent_samples_per_replica": configured // 2}
    direct = simulate(scenario.with_changes(half_config).with_split(16, 16, policy="adaptive"))
    assert half.wall_h == pytest.approx(direct.wall_s / 3600.0)
    assert " hyb." in format_table(rows, recommended=recommend(rows)).splitlines()[0]


def test_plan_refuses_fewer_than_one_workload_draw(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SCENARIOS / "small_production_bound.yaml")
    with pytest.raises(SystemExit):
        cli_main(["plan", "--scenario", path, "--seeds", "0"])
    assert "expected a whole number >= 1, got '0'" in capsys.readouterr().err


def test_a_plan_row_shows_the_trainer_idle_ratio_of_its_run_as_the_seed_metric_sums_it() -> None:
    scenario = small("production").with_prompts(128)
    rows = plan(scenario, policies=("static",), concurrency=(1.0,), workers=1)
    row = next(r for r in rows if r.train_gpus == 16)
    direct = simulate(scenario.with_split(16, 16, policy="static"))
    gen = sum(c["timing_s/gen"] for c in direct.cycles)
    step = sum(c["timing_s/step"] for c in direct.cycles)
    assert 0 < row.trainer_idle_ratio == pytest.approx(gen / step)
    table = format_table(rows, recommended=recommend(rows))
    assert " idle " in table.splitlines()[0]
    line = next(line for line in table.splitlines() if " 16:16" in line)
    assert f"{100 * row.trainer_idle_ratio:.1f}%" in line


def test_the_planner_measures_more_handed_over_samples_arriving_in_their_cycle_when_it_is_long() -> None:
    # fixed_ratio lends the GPUs every cycle; a slower trainer makes each cycle long against the responses
    def on_time_share(seconds_per_ktoken: float) -> float:
        scenario = small("production").with_policy("fixed_ratio").with_changes(
            {"simulator.trainer.seconds_per_ktoken": seconds_per_ktoken})
        simulation = Simulation(scenario)
        simulation.run()
        assert simulation.core.ctx.handover_on_time_share == simulation.executor.meter.handover_on_time_share
        return simulation.executor.meter.handover_on_time_share

    short_cycles, long_cycles = on_time_share(0.001), on_time_share(0.05)
    assert 0.0 < short_cycles < long_cycles < 1.0


def test_without_partial_rollout_the_planner_trains_each_aborted_response_cut_where_it_stopped() -> None:
    scenario = small("production").with_policy("default")
    kept = simulate(scenario)
    cut = simulate(scenario.with_changes({"async_training.partial_rollout": False}))
    assert cut.samples["retried_attempts"] < kept.samples["retried_attempts"]  # only aborts before a token
    assert cut.samples["trained"] == kept.samples["trained"]
    assert cut.tokens["trained"] < kept.tokens["trained"]


def test_without_partial_rollout_the_adaptive_policy_counts_the_samples_a_sync_cuts_as_queued() -> None:
    # the planner's controller reads the samples in flight at each sync, as the live one reads active_tasks
    scenario = small("production").with_policy("adaptive")
    cut = simulate(scenario.with_changes({"async_training.partial_rollout": False}))
    kept = simulate(scenario)
    in_flight = [d["queued_after_sync"] - d["queued"] for d in cut.decisions if "queued_after_sync" in d]
    assert in_flight and max(in_flight) > 0
    assert all(d["queued_after_sync"] == d["queued"] for d in kept.decisions if "queued_after_sync" in d)
    activations = [d for d in cut.decisions if d["decision"] == "activate" and "queued_after_sync" in d]
    assert all(d["wait_for_samples"] > d["queued_after_sync"] for d in activations)
