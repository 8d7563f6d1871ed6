"""Timing model of a GPU trainer, behind the TrainerBackend interface (docs/contracts.md).

Where it sits: the `sim` backend of the trainer service. It runs the planner's trainer model, not
a copy: `sim.scenario.trainer_timing` derives it from the same config as `sim.run` does, and a
micro-step takes `TrainerTiming.micro_step_s` of the tokens it receives (each sample's prompt once
per trajectory plus its responses, as the planner counts them): `trainer.time_per_sample_s` per
sample and GPU, plus `simulator.trainer`'s token model or `simulator.physics`' (split over the
original's timing keys). Where the planner charges the trainer outside the micro-step, the service
calls a hook at the same point: `assemble_batch` (the batch collection, inside timing_s/gen) and
`validate` (blocking, outside timing_s/step). Giving the GPUs to hybrids costs `offload_s` each way.
Every modelled second is `time_scale` wall seconds.
"""

from __future__ import annotations

import time
from typing import Any

from shared.config import Config
from sim.scenario import trainer_timing

# Share of a micro-step's compute per timing key (the original's training phases).
_PHASE_SHARES = {"timing_s/reward": 0.05, "timing_s/ref": 0.15, "timing_s/adv": 0.02,
                 "timing_s/update_actor": 0.78}


def trained_tokens(sample: Any) -> int:
    """Tokens the trainer processes for one sample: its prompt once per trajectory + every response
    (``sim.model.Workload.sample_tokens`` of the planner)."""
    return (len(sample.prompt_token_ids) * len(sample.trajectories)
            + sum(len(t.response_token_ids) for t in sample.trajectories))


class SimTrainer:
    def __init__(self, config: Config) -> None:
        self.timing = trainer_timing(config)
        self.trigger_parameter_sync_step = config.async_training.trigger_parameter_sync_step
        self.offload_s = config.trainer.offload_s
        self.time_scale = config.run.time_scale
        self.on_gpu = True

    def assemble_batch(self, samples: list[Any]) -> None:
        if self.timing.collect_s:
            time.sleep(self.timing.collect_s * self.time_scale)

    def train_micro_step(self, samples: list[Any]) -> dict[str, float]:
        total_s = self.timing.micro_step_s(trained_tokens(s) for s in samples) * self.time_scale
        timings = {key: share * total_s for key, share in _PHASE_SHARES.items()}
        time.sleep(total_s)
        rewards = [t.reward for s in samples for t in s.trajectories]
        return {**timings, "training/reward_mean": sum(rewards) / max(1, len(rewards))}

    def validate(self, *, global_steps: int, version: int) -> None:
        if global_steps == 0:
            validation_s = self.timing.validation_before_train_s
        else:
            validation_s = self.timing.validation_after_s(
                global_steps=global_steps, version=version,
                trigger_parameter_sync_step=self.trigger_parameter_sync_step)
        if validation_s:
            time.sleep(validation_s * self.time_scale)

    def export_weights(self, version: int) -> str | None:
        return None

    def save_checkpoint(self, version: int, global_steps: int = 0) -> None:
        """Nothing to save: the sim has no parameters."""

    def resume_from(self, pointer: str) -> int | None:
        return None

    def resume_latest(self) -> int | None:
        return None

    def release_gpu(self) -> None:
        if self.on_gpu:
            time.sleep(self.offload_s * self.time_scale)
            self.on_gpu = False

    def acquire_gpu(self) -> None:
        if not self.on_gpu:
            time.sleep(self.offload_s * self.time_scale)
            self.on_gpu = True

    def push_weights(self, transport: str, client: object) -> None:
        raise ValueError("the sim trainer has no push weight transport (config validation forbids it)")
