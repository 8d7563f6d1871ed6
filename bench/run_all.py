"""Run every benchmark, write one JSON, print one table (`make bench`).

Where it sits: each `bench/bench_*.py` module runs as its own process
(`python -m bench.<module> --out FILE`, its own throwaway redis-server), bounded
by `--timeout-s`; a failed or timed-out bench is recorded with its log tail and
the others still run. The combined JSON holds every bench's full result; the
table shows the headline numbers. `--quick` shrinks every bench (a smoke run,
numbers not for reporting); `--skip sim_configs` leaves out the multi-minute
end-to-end runs.

Run: ``python -m bench.run_all --out runs/bench_all.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BENCHES: dict[str, dict[str, list[str]]] = {
    "mq": {"full": [],
           "quick": ["--num-samples", "2000", "--num-unpipelined", "500", "--bench-requests", "10000"]},
    "lb": {"full": [], "quick": ["--num-requests", "20000", "--num-paced", "200", "--num-burst", "2000"]},
    "control_plane": {"full": [], "quick": ["--num-switches", "3", "--dwell-s", "0.1"]},
    "codec": {"full": [], "quick": ["--repeats", "1"]},
    "sim_configs": {"full": [], "quick": ["--config", "configs/sim_small.yaml"]},
}
"""Bench name -> extra arguments of `python -m bench.bench_<name>`, full and --quick."""


def run_bench(name: str, args: list[str], *, timeout_s: float, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{name}.json"
    cmd = [sys.executable, "-m", f"bench.bench_{name}", "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    started = time.monotonic()
    print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        status = "ok" if proc.returncode == 0 and out.exists() else f"exit {proc.returncode}"
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        partial = [out for out in (exc.stdout, exc.stderr) if out]
        status = f"timeout after {timeout_s:.0f}s"
        log = "".join(out.decode(errors="replace") if isinstance(out, bytes) else out for out in partial)
    elapsed_s = time.monotonic() - started
    print(f"[{name}] {status} in {elapsed_s:.0f}s", flush=True)
    if status != "ok":
        print(log[-3000:], file=sys.stderr)
        return {"status": status, "elapsed_s": elapsed_s, "log_tail": log[-3000:]}
    return {"status": status, "elapsed_s": elapsed_s, "stdout": proc.stdout,
            "result": json.loads(out.read_text())}


def _mq_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(case, f"{per_s:,.0f} samples/s") for case, per_s in result["stream"].items()]
    for p, row in result["redis_benchmark_xadd_512B_c50"].items():
        rows.append((f"redis-benchmark XADD 512B c50 {p}", f"{row['requests_per_s']:,.0f} req/s"))
    return rows


def _control_plane_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for scenario, res in result["scenarios"].items():
        for kind in ("deactivate", "activate"):
            row = res[kind]
            rows.append((f"{scenario} {kind} overhead (engines {row['modelled_ms']:.0f} ms)",
                         f"p50 {row['overhead']['p50_ms']:.1f} ms  p99 {row['overhead']['p99_ms']:.1f} ms"))
    return rows


def _lb_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for row in result["in_process"]:
        rows.append((f"LoadBalancerState {row['num_replicas']} replicas{' sticky' if row['sticky'] else ''}",
                     f"{row['requests_per_s']:,.0f} req/s  acquire p50 {row['acquire_p50_us']:.2f} us  "
                     f"p99 {row['acquire_p99_us']:.2f} us"))
    svc = result["service"]
    for row in svc["paced"]:
        rows.append((f"LB service {svc['num_replicas']} replicas, paced {row['offered_per_s']:.0f}/s",
                     f"p50 {row['p50_ms']:.2f} ms  p99 {row['p99_ms']:.2f} ms"))
    burst = svc["burst"]
    rows.append((f"LB service {svc['num_replicas']} replicas, burst {burst['sent']}",
                 f"{burst['routed_per_s']:,.0f} req/s  p50 {burst['p50_ms']:.0f} ms  "
                 f"p99 {burst['p99_ms']:.0f} ms"))
    return rows


def _codec_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for message, row in result["messages"].items():
        for variant in ("hand-written", "msgspec/dataclass"):
            times = row[variant]
            rows.append((f"{message} {variant}",
                         f"encode {times['encode_us']:.1f} us  decode {times['decode_us']:.1f} us"))
    return rows


def _sim_configs_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for run in result["runs"]:
        s, m = run["samples"], run["means"]
        util = m.get("resource_utilization")
        rows.append((Path(run["config"]).stem,
                     f"wall {run['wall_time_s']:.1f} s  trained {s.get('trained')}  lost {s.get('lost')}  "
                     f"act/deact {run['activations']}/{run['deactivations']}  "
                     f"mq_size {m.get('mq_size') or 0:.1f}  util {util if util is None else round(util, 3)}"))
    return rows


HEADLINES: dict[str, Callable[[dict[str, Any]], list[tuple[str, str]]]] = {
    "mq": _mq_rows, "lb": _lb_rows, "control_plane": _control_plane_rows, "codec": _codec_rows,
    "sim_configs": _sim_configs_rows,
}
"""Bench name -> (label, value) pairs of its headline numbers for the combined table."""
assert set(HEADLINES) == set(BENCHES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "runs" / "bench_all.json")
    parser.add_argument("--only", action="append", choices=sorted(BENCHES), default=None)
    parser.add_argument("--skip", action="append", choices=sorted(BENCHES), default=[])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not numbers to report")
    parser.add_argument("--timeout-s", type=float, default=2400.0, help="bound on each bench")
    args = parser.parse_args(argv)
    names = [n for n in (args.only or list(BENCHES)) if n not in args.skip]
    results: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m_start": os.getloadavg()[0],
                               "quick": args.quick, "benches": {}}
    with tempfile.TemporaryDirectory(prefix="dynsched-bench-all-") as workdir:
        for name in names:
            extra = BENCHES[name]["quick" if args.quick else "full"]
            results["benches"][name] = run_bench(name, extra, timeout_s=args.timeout_s, workdir=Path(workdir))
    results["loadavg_1m_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    width = 64
    print(f"\n{'bench':14s} {'case':{width}s} value")
    for name, entry in results["benches"].items():
        if entry["status"] != "ok":
            print(f"{name:14s} {'(failed)':{width}s} {entry['status']}")
            continue
        for label, value in HEADLINES[name](entry["result"]):
            print(f"{name:14s} {label:{width}s} {value}")
    print(f"wrote {args.out}")
    return 0 if all(e["status"] == "ok" for e in results["benches"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
