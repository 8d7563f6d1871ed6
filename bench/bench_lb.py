"""Load-balancer routing: pure decisions per second, and latency/throughput through the service.

Where it sits: the load balancer sits between the rollouter (`lb_requests`) and
each rollout-worker's request stream. Two measurements:

1. in-process: `core.routing.LoadBalancerState` as the service drives it:
   acquire (least in-flight + sticky LRU), then for each finished request
   release + forget, with a steady window of requests in flight; also sticky
   re-acquires (a partial rollout resuming). Decisions/s and acquire p50/p99.
2. end-to-end: the real `python -m services.loadbalancer` process against a
   throwaway redis-server; this process XADDs GenerateRequests to `lb_requests`
   and a fake worker (XREAD on every worker request stream) timestamps their
   arrival and answers each with a zero-token GenerateResult on `lb_results`,
   so the LB also relays results and releases slots, as in a run. A paced
   phase gives unloaded latency, a burst phase the throughput (and the latency
   under saturation, which is queueing).

Run: ``python -m bench.bench_lb --out runs/bench_lb.json`` (< 1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench import write_result
from bench.bench_control_plane import bench_config, percentiles_ms, service_processes
from bench.bench_mq import throwaway_redis
from core.routing import LoadBalancerState
from shared.bus import text
from shared.config import config_from_dict
from shared.names import Names
from shared.schema import FinishReason, GenerateRequest, GenerateResult, decode, encode
from shared.streams import connect, xadd_many

STARTUP_TIMEOUT_S = 30.0


# -- 1. in-process ---------------------------------------------------------------------


def bench_state(*, num_replicas: int, num_requests: int, inflight_per_replica: int,
                sticky: bool) -> dict[str, Any]:
    """Route `num_requests` with `inflight_per_replica * num_replicas` kept in flight."""
    state = LoadBalancerState(replica_ids=[f"r{i}" for i in range(num_replicas)])
    window = inflight_per_replica * num_replicas
    ids = [f"req_{i % window}" if sticky else f"req_{i}" for i in range(num_requests)]
    inflight: deque[tuple[str, str]] = deque()
    started = time.perf_counter()
    for request_id in ids:
        inflight.append((request_id, state.acquire(request_id)))
        if len(inflight) > window:
            done_id, replica_id = inflight.popleft()
            state.release(replica_id)
            if not sticky:
                state.forget(done_id)
    total_s = time.perf_counter() - started
    latencies_s: list[float] = []
    clock = time.perf_counter_ns
    for request_id in ids[: min(len(ids), 50_000)]:
        t0 = clock()
        replica_id = state.acquire(request_id)
        latencies_s.append((clock() - t0) * 1e-9)
        state.release(replica_id)
    lat = percentiles_ms(latencies_s)
    return {"num_replicas": num_replicas, "inflight": window, "sticky": sticky,
            "requests_per_s": num_requests / total_s,
            "acquire_p50_us": lat["p50_ms"] * 1e3, "acquire_p99_us": lat["p99_ms"] * 1e3}


def bench_codec(num_tokens: int, *, repeats: int = 300) -> dict[str, Any]:
    """Cost of the LB's per-request codec work: decode from `lb_requests`, encode to the worker stream."""
    request = GenerateRequest(request_id="r", sample_id="s", prompt_token_ids=list(range(num_tokens)),
                              max_tokens=1)
    started = time.perf_counter()
    for _ in range(repeats):
        fields = encode(request)
    encode_s = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        decode(fields)
    decode_s = (time.perf_counter() - started) / repeats
    return {"prompt_tokens": num_tokens, "encode_us": encode_s * 1e6, "decode_us": decode_s * 1e6}


# -- 2. through the service --------------------------------------------------------------


class FakeWorkers:
    """Reads every worker request stream, stamps arrivals, answers with zero-token results."""

    def __init__(self, url: str, names: Names, replica_ids: tuple[str, ...], *, reply: bool) -> None:
        self.redis = connect(url)
        self.names = names
        self.cursors = {names.worker_requests(r): "0-0" for r in replica_ids}
        self.reply = reply
        self.arrived_s: dict[str, float] = {}
        self.per_replica: dict[str, int] = {r: 0 for r in replica_ids}

    async def start(self) -> None:
        """Read only what arrives from now on (earlier phases left entries on the streams)."""
        for stream in self.cursors:
            last = await self.redis.xrevrange(stream, count=1)
            self.cursors[stream] = text(last[0][0]) if last else "0-0"

    async def run(self, expected: int, deadline_s: float) -> None:
        while len(self.arrived_s) < expected and time.perf_counter() < deadline_s:
            reply: Any = await self.redis.xread(dict(self.cursors), count=1024,
                                                block=100)  # type: ignore[arg-type]
            now = time.perf_counter()
            results = []
            for stream, entries in reply or []:
                for entry_id, fields in entries:
                    self.cursors[text(stream)] = text(entry_id)
                    request = decode(fields)
                    assert isinstance(request, GenerateRequest)
                    self.arrived_s.setdefault(request.request_id, now)
                    self.per_replica[request.replica_id] += 1
                    results.append(encode(GenerateResult(
                        request_id=request.request_id, sample_id=request.sample_id,
                        replica_id=request.replica_id,
                        token_ids=[], logprobs=[], finish_reason=FinishReason.STOP, weight_version=0)))
            if self.reply and results:
                await xadd_many(self.redis, self.names.lb_results, results)


def make_requests(prefix: str, count: int) -> list[dict[Any, Any]]:
    return [encode(GenerateRequest(request_id=f"{prefix}_{i}", sample_id=f"{prefix}_s{i // 4}",
                                   prompt_token_ids=list(range(256)), max_tokens=1024)) for i in range(count)]


async def wait_lb_ready(url: str, names: Names) -> None:
    r = connect(url)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not await r.exists(names.lb_members):
            if time.monotonic() > deadline:
                raise TimeoutError("load balancer did not publish its members")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # its consumer groups are created right after the members
    finally:
        await r.aclose()


async def paced_phase(url: str, names: Names, replica_ids: tuple[str, ...], *, count: int, rate_per_s: float,
                      reply: bool) -> dict[str, Any]:
    """One XADD every 1/rate s; latency = XADD issued -> seen on a worker stream."""
    workers = FakeWorkers(url, names, replica_ids, reply=reply)
    await workers.start()
    producer = connect(url)
    sent_s: dict[str, float] = {}
    requests = make_requests(f"paced{int(rate_per_s)}", count)
    consumer = asyncio.create_task(workers.run(count, time.perf_counter() + count / rate_per_s + 30))
    try:
        start = time.perf_counter()
        for i, fields in enumerate(requests):
            await asyncio.sleep(max(0.0, start + i / rate_per_s - time.perf_counter()))
            sent_s[fields["request_id"]] = time.perf_counter()
            await producer.xadd(names.lb_requests, fields)
        await consumer
    finally:
        consumer.cancel()
        await producer.aclose()
        await workers.redis.aclose()
    lat = percentiles_ms([workers.arrived_s[k] - sent_s[k] for k in workers.arrived_s if k in sent_s])
    return {"offered_per_s": rate_per_s, "routed": len(workers.arrived_s), "sent": count, **lat}


async def burst_phase(url: str, names: Names, replica_ids: tuple[str, ...], *, count: int,
                      reply: bool) -> dict[str, Any]:
    """All `count` requests XADDed pipelined as fast as possible;
    routed/s = count / (last arrival - first send)."""
    workers = FakeWorkers(url, names, replica_ids, reply=reply)
    await workers.start()
    producer = connect(url)
    requests = make_requests("burst", count)
    consumer = asyncio.create_task(workers.run(count, time.perf_counter() + 120))
    sent_s: dict[str, float] = {}
    try:
        start = time.perf_counter()
        for chunk in range(0, count, 256):
            now = time.perf_counter()
            for fields in requests[chunk:chunk + 256]:
                sent_s[fields["request_id"]] = now
            await xadd_many(producer, names.lb_requests, requests[chunk:chunk + 256])
        produced_s = time.perf_counter() - start
        await consumer
    finally:
        consumer.cancel()
        await producer.aclose()
        await workers.redis.aclose()
    routed = len(workers.arrived_s)
    last = max(workers.arrived_s.values(), default=start)
    lat = percentiles_ms([workers.arrived_s[k] - sent_s[k] for k in workers.arrived_s])
    counts = list(workers.per_replica.values())
    return {"sent": count, "routed": routed, "produce_per_s": count / produced_s,
            "routed_per_s": routed / max(1e-9, last - start), "spread_min_max": [min(counts), max(counts)],
            **lat}


def bench_service(*, num_replicas: int, num_paced: int, rates: list[float], num_burst: int,
                  reply: bool) -> dict[str, Any]:
    cfg = bench_config(namespace="benchlb", time_scale=1.0, sleep_s=0, wake_s=0, weight_sync_s=0, load=False,
                       num_standalone=num_replicas, num_hybrid=1)
    config = config_from_dict(cfg)
    names = Names(config.run.namespace)
    with throwaway_redis() as port:
        url = f"redis://127.0.0.1:{port}/0"
        with service_processes(cfg, url, services=("loadbalancer",)) as logs:
            try:
                asyncio.run(wait_lb_ready(url, names))
                paced = [asyncio.run(paced_phase(url, names, config.standalone_ids, count=num_paced,
                                                 rate_per_s=rate, reply=reply)) for rate in rates]
                burst = asyncio.run(burst_phase(url, names, config.standalone_ids, count=num_burst,
                                                reply=reply))
            except Exception:
                for log_file in sorted(logs.glob("*.log")):
                    print(f"--- {log_file.name}\n{log_file.read_text()[-2000:]}", file=sys.stderr)
                raise
    return {"num_replicas": num_replicas, "results_relayed": reply, "paced": paced, "burst": burst}


def print_tables(result: dict[str, Any]) -> None:
    print(f"{'LoadBalancerState (in-process)':40s} {'req/s':>11s} {'acq p50 us':>10s} {'acq p99 us':>10s}")
    for row in result["in_process"]:
        sticky = ", sticky" if row["sticky"] else ""
        label = f"{row['num_replicas']} replicas, {row['inflight']} in flight{sticky}"
        print(f"{label:40s} {row['requests_per_s']:11,.0f} {row['acquire_p50_us']:10.2f} "
              f"{row['acquire_p99_us']:10.2f}")
    for row in result["codec"]:
        print(f"{'GenerateRequest codec, ' + str(row['prompt_tokens']) + ' prompt tokens':40s} "
              f"encode {row['encode_us']:8.0f} us  decode {row['decode_us']:6.0f} us")
    svc = result["service"]
    print(f"{'LB service, ' + str(svc['num_replicas']) + ' replicas (e2e)':40s} {'routed/s':>11s} "
          f"{'p50 ms':>10s} {'p99 ms':>10s}")
    for row in svc["paced"]:
        print(f"{'paced ' + format(row['offered_per_s'], '.0f') + '/s':40s} {row['routed']:11d} "
              f"{row['p50_ms']:10.2f} {row['p99_ms']:10.2f}")
    b = svc["burst"]
    print(f"{'burst ' + str(b['sent']) + ' (saturated)':40s} {b['routed_per_s']:11,.0f} {b['p50_ms']:10.1f} "
          f"{b['p99_ms']:10.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--num-requests", type=int, default=200_000, help="in-process decisions per case")
    parser.add_argument("--num-replicas", type=int, default=8, help="replicas behind the LB service")
    parser.add_argument("--num-paced", type=int, default=1000, help="requests per paced phase")
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 500.0], help="paced rates, req/s")
    parser.add_argument("--num-burst", type=int, default=20_000)
    parser.add_argument("--no-results", action="store_true", help="the fake workers do not answer")
    args = parser.parse_args(argv)
    if min(args.num_requests, args.num_replicas, args.num_paced, args.num_burst) < 1 or min(args.rates) <= 0:
        raise ValueError("counts and rates must be positive")
    load_before = os.getloadavg()
    in_process = [bench_state(num_replicas=n, num_requests=args.num_requests, inflight_per_replica=128,
                              sticky=s)
                  for n in (4, 16, 64) for s in (False, True)]
    codec = [bench_codec(n) for n in (256, 4096)]
    service = bench_service(num_replicas=args.num_replicas, num_paced=args.num_paced, rates=args.rates,
                            num_burst=args.num_burst, reply=not args.no_results)
    result = {"cpus": os.cpu_count(), "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
              "in_process": in_process, "codec": codec, "service": service}
    print_tables(result)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
