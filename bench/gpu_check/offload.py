"""Does TorchGRPOTrainer.release_gpu() give the GPU to another process, and acquire_gpu() take it back intact?

Where it sits: the controller asks the trainer to offload (release_gpus) just before it wakes the
hybrids on the trainer's GPU, and the trainer reloads before its next micro-step. Pass thresholds:

- freed: free device memory after release - before >= 90% of params + grads + optimizer state;
- another process allocates more than was free before the release (the memory is really usable);
- params and optimizer state bit-identical after acquire (grads are dropped by design: set_to_none);
- the next training step runs and its loss is finite.

Replaces bench/gpu_offload.py. The model is a random-init Llama (default ~0.5 B params, 8 GB of state).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.gpu_check.common import Result, cuda_or_reason, gib, main

FREED_FRACTION = 0.9
CHILD_MARGIN_BYTES = 2 << 30
"""Left free for the allocating process's own CUDA context."""
ALLOCATE = """
import sys, torch
n = int(sys.argv[1]); x = torch.empty(n, dtype=torch.uint8, device=sys.argv[2]); x.fill_(7)
torch.cuda.synchronize(); print(int(x[-1]))
"""


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
    return [Smp(prompt_token_ids=[1 + (p + i) % 20 for i in range(8)],
                trajectories=[Traj(response_token_ids=[2 + k, 3 + k], response_logprobs=[-1.0, -1.0],
                                   reward=float(k % 2)) for k in range(4)])
            for p in range(num_prompts)]


def _state(trainer: object) -> dict[str, object]:
    import torch

    model = trainer.model  # type: ignore[attr-defined]
    state = {f"param/{k}": p.detach().cpu().clone() for k, p in model.named_parameters()}
    for i, per_param in enumerate(trainer.optimizer.state.values()):  # type: ignore[attr-defined]
        state.update({f"optim/{i}/{k}": v.detach().cpu().clone()
                      for k, v in per_param.items() if isinstance(v, torch.Tensor)})
    return state


def _state_bytes(trainer: object) -> int:
    import torch

    model = trainer.model  # type: ignore[attr-defined]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    for per_param in trainer.optimizer.state.values():  # type: ignore[attr-defined]
        total += sum(v.numel() * v.element_size() for k, v in per_param.items()
                     if isinstance(v, torch.Tensor) and k != "step")
    return total


def _free(device: object) -> int:
    import torch

    torch.cuda.synchronize(device)  # type: ignore[arg-type]
    return int(torch.cuda.mem_get_info(device)[0])  # type: ignore[arg-type]


def run(args: argparse.Namespace, result: Result) -> Result:
    import torch

    from rl.model import ModelConfig, init_model, save_pretrained
    from services.trainer.torch_backend import GRPOConfig, TorchGRPOTrainer

    no_cuda = cuda_or_reason()
    if no_cuda and not args.dry_run:
        return result.skip(no_cuda)
    hidden, layers = (64, 1) if args.dry_run else (args.hidden, args.layers)
    device = "cpu" if args.dry_run else "cuda:0"
    cfg = ModelConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 128), num_key_value_heads=max(1, hidden // 128))
    data = result.data
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(init_model(cfg, seed=0), Path(tmp) / "model")
        trainer = TorchGRPOTrainer(GRPOConfig(model_path=str(Path(tmp) / "model"), weights_root=f"{tmp}/w",
                                              checkpoint_dir=f"{tmp}/c", device=device))
    data["num_params"] = sum(p.numel() for p in trainer.model.parameters())
    data["step_1_loss"] = trainer.train_micro_step(_samples(args.prompts))["loss"]
    state_bytes = _state_bytes(trainer)
    data["state_gib"] = gib(state_bytes)
    before = _state(trainer)
    cuda = trainer.device.type == "cuda"
    free_before = _free(trainer.device) if cuda else 0
    t0 = time.monotonic()
    trainer.release_gpu()
    data["release_s"] = round(time.monotonic() - t0, 3)
    if cuda:
        free_released = _free(trainer.device)
        data.update(free_before_gib=gib(free_before), free_released_gib=gib(free_released),
                    freed_gib=gib(free_released - free_before))
        result.check("freed_at_least_90pct_of_state",
                     free_released - free_before >= FREED_FRACTION * state_bytes)
        result.check("grads_dropped", all(p.grad is None for p in trainer.model.parameters()))
        wanted = free_released - CHILD_MARGIN_BYTES
        child = subprocess.run([sys.executable, "-c", ALLOCATE, str(wanted), str(trainer.device)],
                               capture_output=True, text=True, timeout=120)
        data.update(second_process_gib=gib(wanted), second_process_rc=child.returncode,
                    second_process_stderr=child.stderr[-800:])
        result.check("another_process_allocates_beyond_what_was_free_before",
                     child.returncode == 0 and wanted > free_before)
    t0 = time.monotonic()
    trainer.acquire_gpu()
    data["acquire_s"] = round(time.monotonic() - t0, 3)
    after = _state(trainer)
    result.check("params_and_optimizer_state_bit_identical", before.keys() == after.keys() and all(
        torch.equal(before[k], after[k]) for k in before))  # type: ignore[arg-type]
    result.check("params_back_on_device",
                 all(p.device.type == trainer.device.type for p in trainer.model.parameters()))
    loss = trainer.train_micro_step(_samples(args.prompts))["loss"]
    data["step_2_loss"] = loss
    result.check("next_training_step_runs", math.isfinite(loss))
    if not cuda:
        result.reason = "dry run on CPU: release/acquire only log; memory thresholds need CUDA"
    return result


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)


if __name__ == "__main__":
    main("offload", run, add_args)
