"""The policy sweep (bench/policy_sweep.py): its columns compare what they say, samples in flight searched."""

from __future__ import annotations

import json
from pathlib import Path

from bench.policy_sweep import SweepRow, jobs_for, main, summarize
from sim.scenario import load_scenario

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim_16_16_adaptive.yaml"


def _row(split: tuple[int, int], policy: str, concurrency: int, wall_h: float) -> SweepRow:
    return SweepRow(scenario="s", train_gpus=split[0], rollout_gpus=split[1], policy=policy, mechanics="seed",
                    concurrency=concurrency, wall_h=wall_h, activations=0)


def test_the_best_static_run_is_searched_over_splits_and_samples_in_flight() -> None:
    rows = [_row((16, 16), "static", 16, 10.0), _row((16, 16), "static", 32, 8.0),
            _row((8, 24), "static", 16, 9.0), _row((16, 16), "adaptive", 16, 8.4)]
    (summary,) = summarize(rows)
    assert summary["best_static"] == "16:16 x32"
    assert summary["best_static_h"] == 8.0
    assert summary["vs_best_static"] == 8.4 / 8.0 - 1.0


def test_the_robustness_check_compares_the_same_split_at_the_same_samples_in_flight() -> None:
    # adaptive at 16 beats static at 16 but loses to static at 32: only the same-concurrency pair counts
    rows = [_row((16, 16), "static", 16, 10.0), _row((16, 16), "static", 32, 8.0),
            _row((16, 16), "adaptive", 16, 9.0), _row((16, 16), "adaptive", 32, 8.2)]
    (summary,) = summarize(rows)
    assert summary["worst_vs_static_same_split"] == max(9.0 / 10.0, 8.2 / 8.0) - 1.0
    assert summary["best_split"] == "16:16 x32"


def test_every_split_policy_and_mechanics_runs_at_every_concurrency_tried() -> None:
    scenario = load_scenario(CONFIG)
    own = scenario.config.async_training.concurrent_samples_per_replica
    jobs = jobs_for(str(CONFIG), scenario, prompts=64, policies=["adaptive"], concurrency=(1.0, 2.0))
    assert {job[-1] for job in jobs} == {own, 2 * own}
    at_own = [job[:-1] for job in jobs if job[-1] == own]
    at_twice = [job[:-1] for job in jobs if job[-1] == 2 * own]
    assert at_own == at_twice
    runs = {("static", "seed"), ("adaptive", "seed"), ("adaptive", "fast")}
    assert {(job[3], job[4]) for job in at_own} == runs


def test_static_fully_async_is_not_swept_twice_as_a_policy() -> None:
    jobs = jobs_for(str(CONFIG), load_scenario(CONFIG), prompts=64)
    assert "static_fully_async" not in {job[3] for job in jobs}
    assert {"static", "adaptive", "default", "fixed_ratio"} <= {job[3] for job in jobs}


def test_a_short_sweep_writes_its_rows_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    assert main(["--config", str(CONFIG), "--prompts", "96", "--policy", "adaptive", "--concurrency", "1,2",
                 "--workers", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    static = [r for r in result["rows"] if r["policy"] == "static"]
    best = min(static, key=lambda r: r["wall_h"])
    for summary in result["summary"]:
        assert summary["best_static_h"] == best["wall_h"]
        assert summary["best_static"] == f"{best['train_gpus']}:{best['rollout_gpus']} x{best['concurrency']}"
