"""Timing model of a GPU trainer, behind the TrainerBackend interface (docs/contracts.md).

Where it sits: the `sim` backend of the trainer service. A micro-step over
`k` samples takes `k * time_per_sample_s / num_gpus` modelled seconds (split
over the original's timing keys), and giving the GPUs to hybrids costs
`offload_s` each way. Every modelled second is `time_scale` wall seconds.
"""

from __future__ import annotations

import time
from typing import Any

from shared.config import Config

# Share of a micro-step's compute per timing key (the original's training phases).
_PHASE_SHARES = {"timing_s/reward": 0.05, "timing_s/ref": 0.15, "timing_s/adv": 0.02,
                 "timing_s/update_actor": 0.78}


class SimTrainer:
    def __init__(self, config: Config) -> None:
        self.time_per_sample_s = config.trainer.time_per_sample_s
        self.num_gpus = config.trainer.num_gpus
        self.offload_s = config.trainer.offload_s
        self.time_scale = config.run.time_scale
        self.on_gpu = True

    def train_micro_step(self, samples: list[Any]) -> dict[str, float]:
        total_s = len(samples) * self.time_per_sample_s / self.num_gpus * self.time_scale
        timings = {key: share * total_s for key, share in _PHASE_SHARES.items()}
        time.sleep(total_s)
        rewards = [t.reward for s in samples for t in s.trajectories]
        return {**timings, "training/reward_mean": sum(rewards) / max(1, len(rewards))}

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
