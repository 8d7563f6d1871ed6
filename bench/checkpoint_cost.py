"""What the torch trainer's per-micro-step checkpoint costs (docs/reliability.md).

The trainer saves model + optimizer before every commit, so the commit can name it (the checkpoint
pointer). This times `save_checkpoint` (torch.save + fsync + rename) on the default model
(rl.model.ModelConfig) after one update (the optimizer holds its moments), on one CPU thread.

    PYTHONPATH=. python -m bench.checkpoint_cost
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.torch_toy import ToySample, ToyTrajectory, toy_trainer
from rl.model import ModelConfig

SAVES = 20


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        trainer = toy_trainer(tmp, ModelConfig())
        trajectories = [ToyTrajectory(response_token_ids=[7 + i % 3, 8], response_logprobs=[-1.0, -1.0],
                                      reward=float(i % 2)) for i in range(8)]
        trainer.train_micro_step([ToySample(prompt_token_ids=[1, 2, 3, 4, 5, 6], trajectories=trajectories)])
        times = []
        for global_steps in range(2, 2 + SAVES):
            started = time.perf_counter()
            name = trainer.save_checkpoint(0, global_steps)
            times.append(time.perf_counter() - started)
        size = (tmp / "ckpt" / name).stat().st_size
    params = sum(p.numel() for p in trainer.model.parameters())
    print(f"params={params} checkpoint={size / 1e6:.1f} MB "
          f"save median={statistics.median(times) * 1e3:.1f} ms max={max(times) * 1e3:.1f} ms (n={SAVES})")


if __name__ == "__main__":
    main()
