"""Sim-to-live: a short config through `dynsched run` (sim engines) and the planner tells one story."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.sim_to_live import agreement, compare, rescaled
from services.launcher import run_job
from services.report import read_audit
from shared.config import load_config
from shared.vocab import AuditKind
from sim.run import simulate
from sim.scenario import Scenario

pytestmark = pytest.mark.e2e
SMALL = Path(__file__).resolve().parent.parent / "configs" / "sim_small.yaml"


def test_agreement_allows_ten_percent_on_wall_twenty_on_activations_and_queue_and_a_tenth_of_a_version_of_lag(
        ) -> None:
    live = {"wall_after_first_version_s": 100.0, "activations": 10.0, "mean_mq_size": 20.0,
            "mean_sample_lag": 0.7}
    assert all(agreement({"wall_after_first_version_s": 109.0, "activations": 12.0, "mean_mq_size": 16.5,
                          "mean_sample_lag": 0.78}, live).values())
    assert agreement({**live, "wall_after_first_version_s": 112.0, "mean_sample_lag": 0.85}, live) == {
        "wall": False, "activations": True, "mean_mq_size": True, "mean_sample_lag": False}


@pytest.mark.timeout(600)
def test_a_short_sim_config_run_live_and_planned_agrees_on_wall_activations_queue_and_data_age(
        tmp_path: Path) -> None:
    # The live system's own cost (~0.2-1 wall s per version on this loaded machine) stays small in
    # modelled time at 2 modelled s per wall s.
    path = rescaled(SMALL, tmp_path, time_scale=0.5, namespace="sim_to_live_test")
    row = compare(path, timeout_s=500.0)
    assert all(row["agree"].values()), row


SCENARIO_LIKE = {  # sim_small's cluster with a scenario's sections: log-normal lengths, token trainer model
    "run": {"name": "sim_to_live_trainer", "namespace": "sim_to_live_trainer", "time_scale": 0.1, "seed": 0},
    "data": {"total_rollout_steps": 128, "n": 4, "max_response_length": 1024, "prompt_length": 128},
    "trainer": {"backend": "sim", "ppo_mini_batch_size": 16, "num_gpus": 2, "time_per_sample_s": 0.0,
                "offload_s": 0.5},
    "async_training": {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 4, "require_batches": 1,
                       "partial_rollout": True, "use_dynamic_resource_scheduling": True,
                       "dynamic_schedule_policy": "default", "concurrent_samples_per_replica": 16},
    "rollout": {"backend": "sim", "nnodes": 1, "n_gpus_per_node": 2, "tensor_model_parallel_size": 1,
                "sim": {"prefill_s_per_token": 0.000025, "decode_s_per_step": 0.01, "batch_slowdown": 0.03,
                        "sleep_s": 1.0, "wake_s": 1.0, "weight_sync_s": 0.5}},
    "simulator": {
        "workload": {"prompt_tokens_median": 200, "prompt_tokens_sigma": 0.4, "prompt_tokens_max": 1024,
                     "response_tokens_median_start": 300, "response_tokens_median_end": 400,
                     "response_tokens_sigma": 0.5, "response_tokens_max": 1024},
        "trainer": {"fixed_s_per_micro_step": 1.0, "seconds_per_ktoken": 0.4, "scaling_efficiency": 0.9,
                    "collect_s_per_sample": 0.05}},
}


@pytest.mark.timeout(300)
def test_a_token_trainer_model_scenario_trains_live_in_the_planners_update_time(tmp_path: Path) -> None:
    # Every fed prompt is trained (2 versions x 64), so both runs train the same tokens whatever the
    # order: the update time per micro-step must agree to rounding. Time per sample alone would be 0,
    # and the sim prompts' old fixed length (128, not the planner's ~200) ~15% short.
    path = tmp_path / "scenario_like.yaml"
    path.write_text(yaml.safe_dump(SCENARIO_LIKE))
    config = load_config(path)
    run_job(path, tmp_path / "run", fresh=True, progress=False, timeout_s=240.0)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    planned = simulate(Scenario.from_config(config)).cycles
    micro_steps = 2 * 4
    scale = config.run.time_scale
    live_update_s = sum(line["dynamic_resource/train_compute_time_s"] for line in lines) / scale / micro_steps
    planned_update_s = sum(c["dynamic_resource/train_compute_time_s"] for c in planned) / micro_steps
    assert len(lines) == len(planned) == 2
    assert planned_update_s > 5.0  # the token part dominates the 1 s fixed part
    assert live_update_s == pytest.approx(planned_update_s, rel=0.01)
    collect_s = 0.05 * 16  # inside timing_s/gen, live as in the planner
    assert sum(line["timing_s/gen"] for line in lines) / scale / micro_steps >= collect_s


def _first_fill_rate(decisions: list[dict[str, Any]]) -> float:
    """The fill rate of the first decision that had a measured hybrid window (the run's first window)."""
    return next(d["fill_samples_per_s"] for d in decisions if d.get("fill_samples_per_s"))


@pytest.mark.timeout(600)
def test_the_adaptive_policy_measures_its_first_hybrid_window_live_at_the_planners_fill_rate(
        tmp_path: Path) -> None:
    # Both runs lend the hybrids at the first sync until `required` samples are queued, so the first
    # window is the same one. A live clock moves between two reads where the planner's does not: a
    # window closed at two instants once made the next cycle count as a near-zero window, and the live
    # fill rate read 7x the planner's (adaptive then planned the longest windows).
    path = rescaled(SMALL, tmp_path, time_scale=0.5, namespace="fill_rate_test",
                    changes={"async_training.dynamic_schedule_policy": "adaptive"})
    config = load_config(path)
    run_job(path, tmp_path / "run", fresh=True, progress=False, timeout_s=500.0)
    audit = read_audit(tmp_path / "run" / "audit.jsonl")
    live_decisions = [e.decision for e in audit if e.kind is AuditKind.DECISION and e.decision]
    live_per_modelled_s = _first_fill_rate(live_decisions) * config.run.time_scale  # live rates: per wall s
    planned = simulate(Scenario.from_config(config))
    assert _first_fill_rate(planned.decisions) > 0
    assert live_per_modelled_s == pytest.approx(_first_fill_rate(planned.decisions), rel=0.25)
