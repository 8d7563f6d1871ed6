"""A CPU torch GRPO trainer on a freshly initialised model, and the toy samples it trains on: what
`bench.checkpoint_cost` and tests/test_torch_backend.py both build. The toy types carry only what
the trainer reads (`TrajectoryLike`, `SampleLike`); the wire types (shared.schema) carry more."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rl.model import ModelConfig, init_model, save_pretrained
from services.trainer.torch_backend import GRPOConfig, TorchGRPOTrainer


@dataclass(frozen=True, kw_only=True)
class ToyTrajectory:
    response_token_ids: list[int]
    response_logprobs: list[float]
    reward: float


@dataclass(frozen=True, kw_only=True)
class ToySample:
    prompt_token_ids: list[int]
    trajectories: list[ToyTrajectory] = field(default_factory=list)


def toy_trainer(root: Path, model: ModelConfig, **overrides: float) -> TorchGRPOTrainer:
    """A CPU trainer under `root`: the model in `model/` (`model` at seed 0, written on the first
    call for that root, so a second trainer there resumes on the same model), weights in `weights/`,
    checkpoints in `ckpt/`; `overrides` are GRPOConfig fields."""
    model_dir = root / "model"
    if not model_dir.exists():
        save_pretrained(init_model(model, seed=0), model_dir)
    return TorchGRPOTrainer(GRPOConfig(model_path=str(model_dir), weights_root=str(root / "weights"),
                                       checkpoint_dir=str(root / "ckpt"), device="cpu",
                                       **overrides))  # type: ignore[arg-type]
