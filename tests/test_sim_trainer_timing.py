"""The live sim trainer and the planner time the trainer with one model (sim.scenario.TrainerTiming)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.rollouter.prompts import build_prompt_source
from services.trainer import sim_backend
from services.trainer.sim_backend import SimTrainer
from shared.config import Config, load_config, replace_config
from shared.schema import FinishReason, Sample, Trajectory
from sim import model
from sim.run import Simulation
from sim.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
TOKEN_MODEL = ROOT / "scenarios" / "small_consumption_bound.yaml"
PHYSICS = ROOT / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml"
PER_SAMPLE = ROOT / "configs" / "sim_small.yaml"
TIME_SCALE = 1e-6
"""Short enough that the live trainer's sleeps cost nothing here."""


def live_config(path: Path, **changes: object) -> Config:
    return replace_config(load_config(path), {"data.total_rollout_steps": 64, "run.time_scale": TIME_SCALE,
                                              "trainer.backend": "sim", "rollout.backend": "sim",
                                              **changes})


def live_batch(config: Config, indices: range) -> list[Sample]:
    """What the live trainer receives for these samples: the sim prompts, and the sim engine's responses
    (the planner's lengths; their token ids do not matter to the timing)."""
    prompts = build_prompt_source(config)
    workload = model.Workload.from_config(config)
    def trajectory(k: int, j: int, length: int) -> Trajectory:
        return Trajectory(request_id=f"sample_0_{k}/{j}", response_token_ids=[7] * length,
                          response_logprobs=[-0.5] * length, finish_reason=FinishReason.STOP)

    return [Sample(sample_id=f"sample_0_{k}", prompt_token_ids=prompts.prompt_at(k)[0], answer="",
                   trajectories=[trajectory(k, j, length) for j, length in enumerate(workload.response[k])])
            for k in indices]


def modelled_s(timings: dict[str, float]) -> float:
    return sum(v for key, v in timings.items() if key.startswith("timing_s/")) / TIME_SCALE


@pytest.mark.parametrize("path", [TOKEN_MODEL, PHYSICS, PER_SAMPLE],
                         ids=["token_model", "physics", "per_sample"])
def test_the_live_sim_trainer_times_a_batch_exactly_as_the_planner(path: Path) -> None:
    config = live_config(path)
    simulation = Simulation(Scenario.from_config(config))
    required = simulation.limits.required_samples
    for start in (0, required, 2 * required):
        indices = range(start, start + required)
        planned = simulation._train_time_s([model.Sample(k, config.data.n, 0.0) for k in indices])
        live = modelled_s(SimTrainer(config).train_micro_step(live_batch(config, indices)))
        assert live == pytest.approx(planned, rel=1e-9)


def test_the_planner_time_of_a_token_model_batch_is_fixed_plus_tokens_over_the_speedup() -> None:
    config = live_config(TOKEN_MODEL)
    workload = model.Workload.from_config(config)
    tokens = sum(workload.sample_tokens(k) for k in range(16))
    assert sum(len(s.prompt_token_ids) for s in live_batch(config, range(16))) == sum(workload.prompt[:16])
    # one trainer unit of 8 GPUs: speedup 1; 1 s fixed + 0.1 s per 1000 tokens (the scenario's numbers)
    live = modelled_s(SimTrainer(config).train_micro_step(live_batch(config, range(16))))
    assert live == pytest.approx(1.0 + tokens / 1000.0 * 0.1, rel=1e-9)
    two_units = live_config(TOKEN_MODEL, **{"trainer.num_gpus": 16})
    live_16 = modelled_s(SimTrainer(two_units).train_micro_step(live_batch(two_units, range(16))))
    assert live_16 == pytest.approx(1.0 + tokens / 1000.0 * 0.1 / (2 * 0.95), rel=1e-9)


def test_without_a_token_model_a_micro_step_costs_time_per_sample_over_the_gpus_only() -> None:
    config = live_config(PER_SAMPLE)  # 16 prompts x 0.6 s / 2 GPUs
    live = modelled_s(SimTrainer(config).train_micro_step(live_batch(config, range(16))))
    assert live == pytest.approx(4.8)


def test_the_live_sim_trainer_pays_batch_collection_and_validation_where_the_planner_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = live_config(PHYSICS, **{
        "simulator.trainer.collect_s_per_sample": 0.25,
        "simulator.physics.validation": {"every_versions": 2, "before_train": True, "response_tokens": 1000}})
    timing = Scenario.from_config(config).trainer
    slept: list[float] = []
    monkeypatch.setattr(sim_backend.time, "sleep", lambda s: slept.append(s / TIME_SCALE))
    trainer = SimTrainer(config)
    trainer.assemble_batch(live_batch(config, range(16)))
    assert slept == [pytest.approx(timing.collect_s)] and timing.collect_s == pytest.approx(0.25 * 16)
    slept.clear()
    trainer.validate(global_steps=0, version=0)  # before training
    for global_steps in range(1, 17):  # trigger 4: versions 1..4 end at micro-steps 4, 8, 12, 16
        trainer.validate(global_steps=global_steps, version=global_steps // 4)
    assert timing.validation_s > 0
    assert slept == [pytest.approx(timing.validation_s)] * 3  # before training, after v2 and v4
