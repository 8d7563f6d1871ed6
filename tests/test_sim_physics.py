"""The physics timing model: context-aware decode, KV-cache capacity, max-length share, bounds, report."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.sim_config import ModelShapeConfig, PhysicsConfig
from sim.engine import Engine
from sim.model import Replica, Request, Sample, Workload
from sim.physics import (
    ACCELERATORS,
    MAX_TRAIN_MFU,
    PhysicsError,
    check,
    decode_timing,
    physics_report,
    problems,
    transferred_mfu,
    validation_s,
)
from sim.scenario import ReplicaTiming, WorkloadShape, load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
QWEN7B = ModelShapeConfig(total_params_b=7.62, active_params_b=7.62, kv_layers=28, kv_heads=4, head_dim=128)


def phys(**overrides: object) -> PhysicsConfig:
    return PhysicsConfig.model_validate({"accelerator": "H20", "model": QWEN7B, **overrides})


def run_replica(cfg: ReplicaTiming, requests: list[Request]) -> tuple[list[tuple[float, str]], Replica]:
    engine = Engine()
    finished: list[tuple[float, str]] = []
    replica = Replica(engine, cfg, replica_id="r0", hybrid=False,
                      on_finish=lambda rep, req: finished.append((engine.now_s, req.request_id)),
                      on_busy=lambda rep, busy: None)
    for req in requests:
        replica.submit(req)
    engine.run()
    return finished, replica


def timing(**overrides: float) -> ReplicaTiming:
    base = {"decode_step_s": 0.01, "batch_half_requests": 1e12, "max_running_requests": 128,
            "prefill_tokens_per_s": 1e12}
    return ReplicaTiming(**{**base, **overrides})  # type: ignore[arg-type]


def test_a_lone_request_pays_for_its_growing_context_exactly() -> None:
    # step = 0.01 + 1e-6 * context; context grows from 1000 to 1100 over 100 tokens
    finished, _ = run_replica(timing(context_token_s=1e-6),
                              [Request("a", Sample(0, 1, 0.0), prompt_tokens=1000, target_tokens=100)])
    expected = 100 * 0.01 + 1e-6 * (1000 * 100 + 100 * 100 / 2)
    assert finished == [(pytest.approx(expected, rel=1e-9), "a")]


def test_a_long_context_neighbour_slows_a_short_request_down() -> None:
    alone, _ = run_replica(timing(context_token_s=1e-6),
                           [Request("a", Sample(0, 1, 0.0), prompt_tokens=10, target_tokens=100)])
    shared, _ = run_replica(timing(context_token_s=1e-6),
                            [Request("a", Sample(0, 1, 0.0), prompt_tokens=10, target_tokens=100),
                             Request("b", Sample(1, 1, 0.0), prompt_tokens=20000, target_tokens=1000)])
    assert dict((rid, t) for t, rid in shared)["a"] > alone[0][0] * 2


def test_a_full_kv_cache_preempts_the_newest_request_which_still_finishes_every_token() -> None:
    reqs = [Request(f"r{i}", Sample(i, 1, 0.0), prompt_tokens=100, target_tokens=400) for i in range(3)]
    finished, replica = run_replica(timing(kv_capacity_tokens=1000.0), reqs)
    assert sorted(rid for _, rid in finished) == ["r0", "r1", "r2"]
    assert replica.preemptions >= 1
    assert all(req.generated == 400 for req in reqs)
    assert replica.tokens_decoded == pytest.approx(1200, abs=1e-6)


def test_the_max_length_share_sends_that_share_of_responses_to_the_max() -> None:
    shape = WorkloadShape(kind="lognormal", prompt_tokens_median=100, prompt_tokens_sigma=0.0,
                          prompt_tokens_max=100,
                          response_tokens_median_start=500, response_tokens_median_end=500,
                          response_tokens_sigma=0.3, response_tokens_max=20000, max_length_share=0.05)
    lengths = [x for row in Workload(shape, num_samples=4000, n=4, seed=0).response for x in row]
    assert sum(x == 20000 for x in lengths) / len(lengths) == pytest.approx(0.05, abs=0.01)


def test_the_decode_coefficients_are_the_h20_peaks_split_over_tensor_parallel_ranks() -> None:
    d = decode_timing(phys(decode_efficiency=1.0), tp=4)
    assert d.weights_s == pytest.approx(7.62e9 * 2 / 4 / 4.0e12)
    assert d.per_request_s == pytest.approx(2 * 7.62e9 / 4 / 148e12)
    assert d.per_context_token_s == pytest.approx(2 * 28 * 1 * 128 * 2 / 4.0e12)  # one KV head per rank
    assert d.kv_capacity_tokens == pytest.approx((0.8 * 96e9 - 7.62e9 * 2 / 4) / (2 * 28 * 128 * 2))


def test_a_decode_faster_than_the_roofline_or_an_mfu_above_sixty_percent_is_refused_with_the_reason() -> None:
    assert problems(phys()) == []
    with pytest.raises(PhysicsError, match="faster than the H20 roofline"):
        check(phys(decode_efficiency=1.3))
    with pytest.raises(PhysicsError, match="train_mfu=0.7"):
        check(phys(train_mfu=0.7))
    assert MAX_TRAIN_MFU == 0.6


def test_weights_that_do_not_fit_the_memory_share_are_a_clear_error() -> None:
    with pytest.raises(PhysicsError, match="do not fit"):
        decode_timing(phys(gpu_memory_utilization=0.02), tp=1)


def test_the_physics_report_compares_the_decode_step_with_the_cited_measurement() -> None:
    lines = physics_report(phys(reference_decode_step_s=0.0133, reference_decode_bw_fraction=0.77,
                                reference_decode="vLLM 8B A100"),
                           tp=4, max_running=256, mean_context_tokens=2000)
    text = "\n".join(lines)
    assert "batch 1" in text and "tokens/s per GPU" in text and "published (engine class)" in text
    assert "KV cache per replica" in text and "MFU" in text and "REFUSED" not in text


@pytest.mark.parametrize("path", sorted(SCENARIOS.rglob("*.yaml")), ids=lambda p: p.stem)
def test_no_shipped_scenario_implies_an_impossible_machine_or_more_than_sixty_percent_mfu(path: Path) -> None:
    config = load_scenario(path).config
    if config.simulator.physics is not None:
        assert problems(config.simulator.physics) == []
        assert config.simulator.physics.reference_decode, "cite a published decode measurement"


def test_a_validation_waits_for_its_longest_response_decoded_on_an_idle_replica() -> None:
    val = {"every_versions": 20, "response_tokens": 28672, "prompt_tokens": 150}
    p = phys(validation=val)
    d = decode_timing(p, tp=4)
    r = 28672.0
    expected = (150 / d.prefill_tokens_per_s + r * (d.overhead_s + d.weights_s)
                + d.per_context_token_s * (150 * r + r * r / 2))
    assert validation_s(p, tp=4) == pytest.approx(expected)
    assert 100.0 < validation_s(p, tp=4) < 200.0  # ~5 ms a token at batch 1: a 28k answer takes minutes
    assert validation_s(phys(), tp=4) == 0.0


def test_batch_collection_costs_the_same_per_sample_whatever_the_micro_step_size() -> None:
    scenario = load_scenario(SCENARIOS / "verl_qwen25_7b_h20.yaml")
    per_sample = scenario.config.simulator.trainer.collect_s_per_sample
    small = scenario.with_changes({"async_training.require_batches": 1})
    assert scenario.trainer.collect_s == pytest.approx(per_sample * 128)
    assert small.trainer.collect_s == pytest.approx(per_sample * 32)


def test_the_non_scaling_trainer_part_is_paid_per_optimizer_step_whatever_the_micro_step_size() -> None:
    scenario = load_scenario(SCENARIOS / "verl_qwen25_7b_h20.yaml")
    per_mini_batch = scenario.config.simulator.physics.train_non_scaling_s  # type: ignore[union-attr]
    rb1 = scenario.with_changes({"async_training.require_batches": 1,
                                 "async_training.trigger_parameter_sync_step": 16})
    assert scenario.trainer.fixed_s_per_micro_step == pytest.approx(4 * per_mini_batch)  # rb 4
    assert rb1.trainer.fixed_s_per_micro_step == pytest.approx(per_mini_batch)
    per_version_rb1 = 16 * rb1.trainer.fixed_s_per_micro_step
    assert per_version_rb1 == pytest.approx(4 * scenario.trainer.fixed_s_per_micro_step)


def test_a_training_mfu_carried_to_an_accelerator_with_less_compute_per_byte_rises() -> None:
    h100, h20 = ACCELERATORS["H100"], ACCELERATORS["H20"]
    carried = transferred_mfu(0.33, measured_on=h100, target=h20, gemm_efficiency=0.7)
    compute = 0.33 / 0.7  # the step's compute-bound share; the rest scales with the bandwidths
    target_time = compute * 989.0 / 148.0 + (1 - compute) * 3.35 / 4.0
    assert carried == pytest.approx(0.33 * 989.0 / 148.0 / target_time)
    assert 0.33 < carried < 1.0


def test_a_step_measured_as_all_compute_keeps_its_mfu_on_any_accelerator() -> None:
    h100, h20 = ACCELERATORS["H100"], ACCELERATORS["H20"]
    assert transferred_mfu(0.4, measured_on=h100, target=h20, gemm_efficiency=0.4) == pytest.approx(0.4)
    assert transferred_mfu(0.4, measured_on=h100, target=h100, gemm_efficiency=0.7) == pytest.approx(0.4)


def test_the_physics_report_places_the_fitted_mfu_against_the_cited_training_measurement() -> None:
    reference = {"accelerator": "H100", "tokens_per_s_per_gpu": 12040.0, "active_params_b": 3.3,
                 "source": "MoE 30B-A3B, 8x H100"}
    slow = "\n".join(physics_report(phys(train_mfu=0.2, reference_train=reference), tp=4, max_running=256,
                                    mean_context_tokens=2000))
    assert "published (trainer class): 12,040 tokens/s per GPU on H100 = 24.1% MFU" in slow
    assert "this fit's scaling part in that basis: 15.0% (below it" in slow
    same_basis = phys(train_mfu=0.59, reference_train=reference, train_flops_per_param_token=6.0)
    fast = "\n".join(physics_report(same_basis, tp=4, max_running=256, mean_context_tokens=2000))
    assert "(within it)" in fast


def test_a_training_measurement_on_an_unknown_accelerator_is_a_clear_error() -> None:
    reference = {"accelerator": "TPU", "tokens_per_s_per_gpu": 9000.0, "active_params_b": 3.0, "source": "x"}
    with pytest.raises(PhysicsError, match="reference_train.accelerator='TPU' is invalid"):
        physics_report(phys(reference_train=reference), tp=4, max_running=256, mean_context_tokens=2000)
