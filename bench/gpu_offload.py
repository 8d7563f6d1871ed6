"""Does the torch trainer really give its GPU memory to the hybrids, and take it back intact?

Where it sits: `TorchGRPOTrainer.release_gpu()` / `acquire_gpu()` (services/trainer/torch_backend.py)
run when the controller activates hybrids on the trainer's GPU and before the next training
step. This check needs CUDA and torch only (no vLLM), so it fits the GPU machine some sessions
are lent: one prepared run, JSON out.

    python -m bench.gpu_offload --out runs/gpu_offload                       # CUDA, ~1.3 B params
    python -m bench.gpu_offload --device cpu --hidden 64 --layers 1 --out /tmp/x   # dry run here

It builds a Llama of the given size (random init), trains one GRPO micro-step so gradients and
AdamW state exist, then measures free device memory (`torch.cuda.mem_get_info`) and torch's
allocated bytes before `release_gpu`, after it, and after `acquire_gpu`, with their times;
checks that params, grads and optimizer state come back bit-identical; and trains another step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl.model import ModelConfig, init_model, save_pretrained
from services.trainer.torch_backend import GRPOConfig, TorchGRPOTrainer


@dataclass(frozen=True)
class Traj:
    response_token_ids: list[int]
    response_logprobs: list[float]
    reward: float


@dataclass(frozen=True)
class Smp:
    prompt_token_ids: list[int]
    trajectories: list[Traj]


def _samples(num_prompts: int) -> list[Smp]:
    """Fixed prompts with 4 responses each, rewards 1/0, so advantages (and gradients) are non-zero."""
    out = []
    for p in range(num_prompts):
        prompt = [1 + (p + i) % 20 for i in range(8)]
        trajs = [Traj(response_token_ids=[2 + k, 3 + k], response_logprobs=[-1.0, -1.0], reward=float(k % 2))
                 for k in range(4)]
        out.append(Smp(prompt_token_ids=prompt, trajectories=trajs))
    return out


def _memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(device)
    return {"free_gib": free / 2**30, "total_gib": total / 2**30,
            "allocated_gib": torch.cuda.memory_allocated(device) / 2**30,
            "reserved_gib": torch.cuda.memory_reserved(device) / 2**30}


def _snapshot(trainer: TorchGRPOTrainer) -> dict[str, torch.Tensor]:
    state = {f"param/{k}": p.detach().cpu().clone() for k, p in trainer.model.named_parameters()}
    state.update({f"grad/{k}": p.grad.detach().cpu().clone()
                  for k, p in trainer.model.named_parameters() if p.grad is not None})
    for i, per_param in enumerate(trainer.optimizer.state.values()):
        state.update({f"optim/{i}/{k}": v.detach().cpu().clone()
                      for k, v in per_param.items() if isinstance(v, torch.Tensor)})
    return state


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = ModelConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers,
                      num_attention_heads=max(1, args.hidden // 128),
                      num_key_value_heads=max(1, args.hidden // 128))
    result: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "hidden": args.hidden,
                              "layers": args.layers}
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(init_model(cfg, seed=0), Path(tmp) / "model")
        trainer = TorchGRPOTrainer(GRPOConfig(model_path=str(Path(tmp) / "model"), weights_root=f"{tmp}/w",
                                              checkpoint_dir=f"{tmp}/c", device=args.device))
        result["num_params"] = sum(p.numel() for p in trainer.model.parameters())
        result["step_1"] = trainer.train_micro_step(_samples(args.prompts))
        before = _snapshot(trainer)
        result["memory_trained"] = _memory(trainer.device)
        t0 = time.monotonic()
        trainer.release_gpu()
        result["release_s"] = time.monotonic() - t0
        result["memory_released"] = _memory(trainer.device)
        t0 = time.monotonic()
        trainer.acquire_gpu()
        result["acquire_s"] = time.monotonic() - t0
        result["memory_acquired"] = _memory(trainer.device)
        after = _snapshot(trainer)
        result["state_tensors"] = len(before)
        result["state_identical"] = before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before)
        result["on_device_after_acquire"] = all(p.device.type == trainer.device.type
                                                for p in trainer.model.parameters())
        result["step_2"] = trainer.train_micro_step(_samples(args.prompts))
    if result["memory_trained"]:
        result["freed_gib"] = result["memory_released"]["free_gib"] - result["memory_trained"]["free_gib"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_offload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_offload.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("step_")}, indent=1))


if __name__ == "__main__":
    main()
