"""Calibration on per-step observables: recovery, refusals, the seed's fit, observables, validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from services.cli import main as dynsched
from shared.config import config_to_dict
from shared.sim_config import PublishedRow
from sim.calibrate import (
    CalibrationError,
    Fit,
    calibrate,
    consistency_notes,
    row_scenario,
    simulate_row,
    write_params,
)
from sim.observe import from_metrics_jsonl, from_result, from_row
from sim.physics import PhysicsError
from sim.run import simulate
from sim.scenario import Scenario, load_scenario
from sim.validate import Check, format_checks

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SEED = SCENARIOS / "seed_qwen35_35b_a3b_32xh20.yaml"
QWEN7B = SCENARIOS / "verl_qwen25_7b_h20.yaml"
STEPS = 8


def synthetic(scenario: Scenario, *, splits: tuple[tuple[int, int], ...] = ((16, 16), (32, 32)),
              columns: tuple[str, ...] = ("step_s", "gen_s", "update_s")) -> Scenario:
    """The scenario with its published rows replaced by what it simulates itself (STEPS steps)."""
    rows = []
    for train, rollout in splits:
        probe = PublishedRow(label=f"{train}:{rollout}", train_gpus=train, rollout_gpus=rollout)
        sim = simulate_row(scenario, probe, STEPS)
        rows.append({"label": probe.label, "train_gpus": train, "rollout_gpus": rollout, "fit": True,
                     **{c: sim.get(c) for c in columns}})
    return scenario.with_changes({"simulator.published": rows})


def qwen7b(**changes: object) -> Scenario:
    return load_scenario(QWEN7B).with_changes({"simulator.physics.train_mfu": 0.3,
                                               "simulator.physics.train_non_scaling_s": 20.0, **changes})


@pytest.mark.timeout(300)
def test_calibration_recovers_the_parameters_a_simulated_run_was_made_with() -> None:
    truth = synthetic(qwen7b())
    start = truth.with_changes({"simulator.physics.train_mfu": 0.2,
                                "simulator.physics.train_non_scaling_s": 5.0})
    _, values, _ = calibrate(start, names=["train_mfu", "train_non_scaling_s"], steps=STEPS, log=False)
    assert values["train_mfu"] == pytest.approx(0.3, rel=0.02)
    assert values["train_non_scaling_s"] == pytest.approx(20.0, abs=1.0)


def test_a_parameter_no_observable_moves_is_refused_with_the_rows_regimes() -> None:
    truth = synthetic(qwen7b(), columns=("update_s",))  # the update does not depend on decode speed
    with pytest.raises(CalibrationError, match="cannot identify decode_efficiency.*mean mq_size"):
        calibrate(truth, names=["decode_efficiency"], steps=STEPS, log=False)


def test_one_trainer_size_cannot_separate_the_scaling_and_non_scaling_trainer_parts() -> None:
    truth = synthetic(qwen7b(), splits=((16, 16),), columns=("update_s",))
    with pytest.raises(CalibrationError, match="cannot separate"):
        calibrate(truth, names=["train_mfu", "train_non_scaling_s"], steps=STEPS, log=False)


@pytest.mark.timeout(300)
def test_a_fit_that_needs_more_than_sixty_percent_mfu_is_refused_saying_why() -> None:
    truth = synthetic(qwen7b(**{"simulator.physics.train_mfu": 0.9}), splits=((16, 16),),
                      columns=("update_s",))
    start = truth.with_changes({"simulator.physics.train_mfu": 0.3})
    with pytest.raises(PhysicsError, match="train_mfu=0.9.*above 60%"):
        calibrate(start, names=["train_mfu"], steps=STEPS, log=False)


def test_no_fit_rows_is_a_clear_error() -> None:
    with pytest.raises(CalibrationError, match="no row has fit: true"):
        Fit(load_scenario(QWEN7B).with_changes({"simulator.published": []}), [], ["train_mfu"], steps=STEPS)


def test_published_columns_that_cannot_hold_in_one_step_are_noted() -> None:
    rows = [from_row(r) for r in load_scenario(QWEN7B).config.simulator.published if r.fit]
    notes = consistency_notes(rows)
    assert len(notes) == 1 and notes[0].startswith("async 16:16: gen + update = 335.1 s > step 294.8 s")


def test_per_step_observables_from_cycles_jsonl_equal_those_of_the_result(tmp_path: Path) -> None:
    scenario = qwen7b().with_prompts(STEPS * 128)
    res = simulate(scenario)
    path = tmp_path / "cycles.jsonl"
    tokens = res.tokens["trained"] / len(res.cycles)
    path.write_text("".join(json.dumps({**c, "sim/trained_tokens": tokens}) + "\n" for c in res.cycles))
    direct = from_result(res)
    read = from_metrics_jsonl(path, label="x", train_gpus=16, rollout_gpus=16, steps_per_cycle=4)
    for name in ("step_s", "gen_s", "update_s", "tokens_per_step", "mq_size"):
        assert read.get(name) == pytest.approx(direct.get(name)), name
    assert read.hours == {STEPS: pytest.approx(res.wall_s / 3600.0)}


def test_write_params_rewrites_the_fitted_lines_and_keeps_the_comments(tmp_path: Path) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(SEED.read_text())
    write_params(path, {"decode_efficiency": 0.42, "train_mfu": 0.21})
    physics = load_scenario(path).config.simulator.physics
    assert physics is not None and (physics.decode_efficiency, physics.train_mfu) == (0.42, 0.21)
    assert path.read_text().count("# fitted") == 2


def test_validate_prints_published_vs_predicted_for_every_row(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = config_to_dict(load_scenario(QWEN7B).config)
    config["simulator"]["published"] = [
        {"label": "fitted 16:16", "train_gpus": 16, "rollout_gpus": 16, "fit": True, "step_s": 300.0},
        {"label": "held out 32:32", "train_gpus": 32, "rollout_gpus": 32, "gen_s": 25.0,
         "hours": {STEPS: 0.4}}]
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump(config))
    assert dynsched(["validate", "--config", str(path), "--max-steps", str(STEPS)]) == 0
    out = capsys.readouterr().out
    assert "accelerator H20" in out and "published (engine class)" in out
    assert "fitted 16:16" in out and "held out 32:32" in out and f"hours@{STEPS}" in out
    assert "unfitted rows: max |error|" in out


@pytest.mark.timeout(300)
def test_the_calibrated_seed_static_runs_are_within_two_percent_of_the_measured_hours() -> None:
    scenario = load_scenario(SEED)
    for row in scenario.config.simulator.published:
        if row.fit:
            sim = simulate_row(scenario, row, max(row.hours))
            assert sim.hours[max(row.hours)] == pytest.approx(row.hours[max(row.hours)], rel=0.02), row.label


def test_a_version_row_simulates_whole_versions_and_reports_per_version_sums() -> None:
    scenario = qwen7b()
    row = PublishedRow(label="v", train_gpus=16, rollout_gpus=16, step_unit="version")
    at_row = row_scenario(scenario, row, 2)
    assert at_row.async_training.total_rollout_steps == 2 * 512
    res = simulate(at_row)
    per_version, per_micro = from_result(res, step_unit="version"), from_result(res)
    for name in ("step_s", "gen_s", "update_s", "tokens_per_step"):
        assert per_version.get(name) == pytest.approx(4 * per_micro.get(name)), name  # type: ignore[operator]
    assert set(per_version.hours) == {1, 2} and set(per_micro.hours) == {4, 8}


@pytest.mark.timeout(120)
def test_validation_blocks_the_trainer_in_wall_time_but_not_in_the_step_timer() -> None:
    val = {"every_versions": 1, "before_train": True, "response_tokens": 28672, "prompt_tokens": 150}
    plain = qwen7b(**{"simulator.physics.validation": None}).with_prompts(2 * 512)
    validated = qwen7b(**{"simulator.physics.validation": val}).with_prompts(2 * 512)
    a, b = simulate(plain), simulate(validated)
    val_s = validated.trainer.validation_s
    assert val_s > 100.0
    # before training and after version 1 (version 2's runs after its step is logged)
    assert b.cycles[-1]["time_s"] - a.cycles[-1]["time_s"] == pytest.approx(2 * val_s, rel=0.1)
    assert from_result(b).step_s == pytest.approx(from_result(a).step_s, rel=0.1)


@pytest.mark.timeout(300)
def test_a_closed_form_fit_recovers_the_trainer_of_consumption_bound_rows() -> None:
    truth = synthetic(qwen7b())
    start = truth.with_changes({"simulator.physics.train_mfu": 0.2,
                                "simulator.physics.train_non_scaling_s": 5.0})
    _, values, _ = calibrate(start, names=["train_mfu", "train_non_scaling_s"], steps=STEPS, log=False,
                             closed_form_after=STEPS)
    assert values["train_mfu"] == pytest.approx(0.3, rel=0.05)
    assert values["train_non_scaling_s"] == pytest.approx(20.0, abs=2.0)


@pytest.mark.timeout(300)
def test_a_closed_form_fit_is_refused_when_a_row_waits_for_generation() -> None:
    slow_decode = {"simulator.physics.decode_efficiency": 0.01}
    truth = synthetic(qwen7b(**slow_decode), splits=((16, 16), (32, 32)))
    with pytest.raises(CalibrationError, match="needs every fit row consumption-bound.*16:16: waits"):
        calibrate(truth, names=["train_mfu", "train_non_scaling_s"], steps=STEPS, log=False,
                  closed_form_after=STEPS)


def test_validate_counts_the_held_out_checks_within_the_ten_percent_target() -> None:
    checks = [Check(row="fit", fitted=True, quantity="hours@100", published=1.0, predicted=1.5),
              Check(row="a", fitted=False, quantity="hours@100", published=1.0, predicted=1.05),
              Check(row="a", fitted=False, quantity="hours@200", published=2.0, predicted=2.5),
              Check(row="a", fitted=False, quantity="step_s", published=100.0, predicted=95.0)]
    lines = format_checks(checks)
    assert "unfitted rows, wall-time checks: 1 of 2 within 10%" in lines
    assert "unfitted rows, all checks: 2 of 3 within 10%" in lines
