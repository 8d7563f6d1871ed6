"""MessageQueue throughput: RL-shaped samples per second through a Redis stream.

Where it sits: the MessageQueue is the stream between the rollouter (producer)
and the trainer's consumer group. This measures the path both services use,
``shared.streams.xadd_many`` and ``StreamConsumer.read`` + one XACK per batch,
with a msgpack sample of ~1024 token ids + 512 logprobs, and compares it with
``redis-benchmark`` XADD (512 B field, 50 clients) on the same throwaway
server. Run: ``python -m bench.bench_mq --out runs/bench_mq.json`` (< 1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

from bench import write_result
from shared.runtime import free_port
from shared.streams import StreamConsumer, connect, ensure_group, xadd_many

STREAM = "bench:mq"
GROUP = "trainer"


@contextmanager
def throwaway_redis() -> Iterator[int]:
    """A redis-server on a free port in a temp dir, no persistence; yields the port."""
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(500):
                if subprocess.run(["redis-cli", "-p", str(port), "ping"],
                                  capture_output=True).stdout.startswith(b"PONG"):
                    break
                time.sleep(0.01)
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def make_sample(index: int, rng: random.Random) -> dict[bytes, bytes]:
    """One RL sample as the rollouter writes it: readable header + one msgpack payload."""
    payload = {
        "prompt_token_ids": [rng.randrange(151_000) for _ in range(512)],
        "response_token_ids": [rng.randrange(151_000) for _ in range(512)],
        "response_logprobs": [-rng.random() * 5 for _ in range(512)],
        "reward": 1.0,
    }
    return {
        b"type": b"sample",
        b"sample_id": f"sample_0_{index}".encode(),
        b"min_version": b"3",
        b"max_version": b"4",
        b"payload": msgpack.packb(payload),
    }


async def produce(url: str, samples: list[dict[bytes, bytes]], *, pipelined: bool) -> float:
    """Seconds to XADD every sample, pipelined x64 or one round trip each."""
    r = connect(url)
    try:
        start_s = time.perf_counter()
        if pipelined:
            await xadd_many(r, STREAM, samples, chunk_size=64)
        else:
            for sample in samples:
                await r.xadd(STREAM, sample)  # type: ignore[arg-type]
        return time.perf_counter() - start_s
    finally:
        await r.aclose()


async def consume(url: str, num_samples: int, *, count: int) -> float:
    """Seconds for the trainer-style reader to read, unpack and ack ``num_samples``."""
    r = connect(url)
    consumer = StreamConsumer(r, stream=STREAM, group=GROUP, consumer="bench-trainer-0")
    await consumer.start()
    try:
        start_s, done = time.perf_counter(), 0
        while done < num_samples:
            entries = await consumer.read(count=count, block_ms=1000)
            for entry in entries:
                msgpack.unpackb(entry.fields[b"payload"])
            await consumer.ack(e.entry_id for e in entries)
            done += len(entries)
        return time.perf_counter() - start_s
    finally:
        await consumer.aclose()
        await r.aclose()


async def reset_stream(url: str) -> None:
    r = connect(url)
    try:
        await r.delete(STREAM)
        await ensure_group(r, STREAM, GROUP)
    finally:
        await r.aclose()


async def run_stream_cases(url: str, samples: list[dict[bytes, bytes]],
                           num_unpipelined: int) -> dict[str, float]:
    n = len(samples)
    results: dict[str, float] = {}
    await reset_stream(url)
    results["produce_pipelined_x64_samples_per_s"] = n / await produce(url, samples, pipelined=True)
    results["consume_count128_samples_per_s"] = n / await consume(url, n, count=128)
    await reset_stream(url)
    few = samples[:num_unpipelined]
    results["produce_unpipelined_samples_per_s"] = len(few) / await produce(url, few, pipelined=False)
    await reset_stream(url)
    start_s = time.perf_counter()
    await asyncio.gather(produce(url, samples, pipelined=True), consume(url, n, count=128))
    results["end_to_end_concurrent_samples_per_s"] = n / (time.perf_counter() - start_s)
    await reset_stream(url)
    return results


def redis_benchmark_xadd(port: int, *, pipeline: int, num_requests: int) -> dict[str, float]:
    """``redis-benchmark -n N -c 50 [-P p] XADD bench * f <512B>``; rps and latency (ms)."""
    cmd = ["redis-benchmark", "-p", str(port), "-n", str(num_requests), "-c", "50", "-P", str(pipeline),
           "--csv",
           "XADD", "bench", "*", "f", "x" * 512]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    row = rows[-1]
    return {
        "requests_per_s": float(row["rps"]),
        "p50_ms": float(row.get("p50_latency_ms", "nan")),
        "p99_ms": float(row.get("p99_latency_ms", "nan")),
    }


def encoding_cost_us(samples: list[dict[bytes, bytes]]) -> dict[str, float]:
    payloads = [s[b"payload"] for s in samples[:500]]
    start_s = time.perf_counter()
    objs = [msgpack.unpackb(p) for p in payloads]
    decode_s = time.perf_counter() - start_s
    start_s = time.perf_counter()
    for obj in objs:
        msgpack.packb(obj)
    encode_s = time.perf_counter() - start_s
    return {"encode_us": encode_s / len(objs) * 1e6, "decode_us": decode_s / len(objs) * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--num-samples", type=int, default=20_000)
    parser.add_argument("--num-unpipelined", type=int, default=5_000)
    parser.add_argument("--bench-requests", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.num_samples < 1 or args.num_unpipelined < 1:
        raise ValueError(f"sample counts must be >= 1, got {args.num_samples}, {args.num_unpipelined}")
    if shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-server and redis-benchmark must be on PATH")

    rng = random.Random(0)
    samples = [make_sample(i, rng) for i in range(args.num_samples)]
    entry_bytes = sum(len(k) + len(v) for k, v in samples[0].items())
    with throwaway_redis() as port:
        url = f"redis://127.0.0.1:{port}/0"
        stream = asyncio.run(run_stream_cases(url, samples, min(args.num_unpipelined, args.num_samples)))
        bench = {f"P{p}": redis_benchmark_xadd(port, pipeline=p,
                                               num_requests=args.bench_requests) for p in (1, 16)}
        server_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                        text=True).stdout.strip()
    result: dict[str, Any] = {
        "redis_server": server_version,
        "num_samples": args.num_samples,
        "sample_entry_bytes": entry_bytes,
        "msgpack": encoding_cost_us(samples),
        "stream": stream,
        "redis_benchmark_xadd_512B_c50": bench,
    }
    print(f"sample entry: {entry_bytes} B, msgpack encode {result['msgpack']['encode_us']:.0f} us, "
          f"decode {result['msgpack']['decode_us']:.0f} us")
    print(f"{'case':48s} {'per s':>12s}")
    for name, value in stream.items():
        print(f"{name:48s} {value:12,.0f}")
    for name, row in bench.items():
        print(f"{'redis-benchmark XADD 512B c50 ' + name:48s} {row['requests_per_s']:12,.0f}"
              f"   p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
