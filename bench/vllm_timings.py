"""Measure the real vLLM engine's control-path timings and print a table.

Usage: `python -m bench.vllm_timings [--model DIR] [--repeats N]`. Without --model it builds
a random tiny Llama (no warm-up needed for timings). Measures engine init, a cold and warm
batch of task-sized generations, abort of long in-flight requests, pause while idle, resume,
in-place reload from the filesystem transport (and the publish that precedes it), the gloo
push (shared/weight_transfer.py: joining the trainer's group once, then a push per version),
and sleep/wake (emulated on CPU). These are
the numbers docs/real_training.md quotes; the simulator's vllm timing model can be
calibrated from them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from rl.model import ModelConfig, init_model, load_pretrained, save_pretrained
from rl.task import make_problems
from rl.tokenizer import CharTokenizer
from services.rollout_worker.vllm_engine import SamplingConfig, VllmEngine, VllmEngineConfig
from shared import weight_transfer, weights
from shared.runtime import free_port

LONG_TOKENS = 200


async def _timed(results: dict[str, list[float]], key: str, coro: object) -> object:
    t0 = time.monotonic()
    out = await coro  # type: ignore[misc]
    results.setdefault(key, []).append(time.monotonic() - t0)
    return out


async def measure(model_dir: Path, weights_root: Path, repeats: int) -> dict[str, list[float]]:
    tok = CharTokenizer()
    prompts = [tok.encode(p.prompt) for p in make_problems(seed=0, count=64)]
    results: dict[str, list[float]] = {}
    engine = VllmEngine(
        VllmEngineConfig(
            model_path=str(model_dir),
            sampling=SamplingConfig(seed=0, ignore_eos=True),
            kv_cache_memory_bytes=64 << 20,
            max_model_len=256,
            weight_transfer="gloo",
        )
    )
    await _timed(results, "engine init (start)", engine.start())
    version, path = weights.latest(weights_root) or (0, model_dir)
    trainer_model = load_pretrained(model_dir)
    client = weight_transfer.LocalSyncClient([engine], asyncio.get_running_loop(), version=version)
    await engine.abort_all()
    pusher = await _timed(results, "join push group (gloo, once)", asyncio.to_thread(
        weight_transfer.trainer_engine, "gloo", client=client, module=trainer_model, world_size=2,
        master_address="127.0.0.1", master_port=free_port()))
    await engine.resume()

    async def batch(tag: str, max_tokens: int) -> list[object]:
        return await asyncio.gather(
            *(
                engine.generate(request_id=f"{tag}-{i}", prompt_token_ids=p, max_tokens=max_tokens)
                for i, p in enumerate(prompts)
            )
        )

    try:
        await _timed(results, "generate 64x5 tokens (cold)", batch("cold", 5))
        for r in range(repeats):
            await _timed(results, "generate 64x5 tokens (warm)", batch(f"w{r}", 5))
            await _timed(
                results,
                "generate 1x5 tokens",
                engine.generate(request_id=f"one{r}", prompt_token_ids=prompts[0], max_tokens=5),
            )
            inflight = asyncio.ensure_future(batch(f"long{r}", LONG_TOKENS))
            await asyncio.sleep(0.3)
            await _timed(results, "abort 64 in-flight", engine.abort_all())
            outs = await inflight
            results.setdefault("partial tokens at abort (mean)", []).append(
                statistics.mean(len(o.token_ids) for o in outs)  # type: ignore[attr-defined]
            )
            await _timed(results, "resume", engine.resume())
            await _timed(results, "pause (idle abort_all)", engine.abort_all())
            await _timed(
                results, "reload weights (in place)", engine.load_weights(version=version, path=str(path))
            )
            await engine.resume()
            await engine.abort_all()
            await _timed(results, "push weights (gloo, in memory)",
                         asyncio.to_thread(pusher.send_weights))  # type: ignore[attr-defined]
            await _timed(results, "publish a version (filesystem)", asyncio.to_thread(
                weights.publish, weights_root, version + 1 + r, trainer_model.state_dict(),
                extra_files=model_dir))
            await engine.resume()
            await _timed(results, f"sleep ({engine.sleep_mode})", engine.sleep())
            await _timed(results, f"wake ({engine.sleep_mode})", engine.wake())
            await engine.resume()
    finally:
        t0 = time.monotonic()
        await engine.close()
        results["close"] = [time.monotonic() - t0]
    return results


def print_table(results: dict[str, list[float]]) -> None:
    print(f"{'operation':34s} {'median':>10s} {'min':>10s} {'max':>10s} {'n':>3s}")
    for key, values in results.items():
        unit = "" if key.startswith("partial") else "s"
        med, lo, hi = statistics.median(values), min(values), max(values)
        print(f"{key:34s} {med:>9.3f}{unit} {lo:>9.3f}{unit} {hi:>9.3f}{unit} {len(values):>3d}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_timings")
    parser.add_argument("--model", help="model directory (default: build a random tiny Llama)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else Path(tmp) / "model"
        if not args.model:
            save_pretrained(init_model(ModelConfig(max_position_embeddings=256), seed=0), model_dir)
        root = Path(tmp) / "weights"
        weights.publish(root, 1, model_dir, extra_files=model_dir)
        print_table(asyncio.run(measure(model_dir, root, args.repeats)))


if __name__ == "__main__":
    main()
