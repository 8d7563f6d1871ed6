"""Wall times of the static and dynamic sim configs side by side, through the real launcher.

Where it sits: each config runs end to end with `services.launcher.run_job`
(embedded redis-server, one process per service and per replica, sim
engines and sim trainer), exactly as `dynsched run` does. From each run's
`summary.json` and `metrics.jsonl` this reports wall time, trained / lost
samples, activations / deactivations, and the per-cycle means of
`dynamic_resource/mq_size` and the utilization metrics.

Run: ``python -m bench.bench_sim_configs --out runs/bench_sim.json`` (each config
takes a few minutes; `--timeout-s` bounds each run, `--config` picks others).
``--time-scale S`` runs every config at another `run.time_scale` (wall seconds per modelled
second): the services' own cost per command (Redis round trips, process scheduling: tens of
wall ms on this 2-core machine) is fixed in wall seconds, so the smaller the scale the larger
it is against the modelled wake, sleep and sync (docs/benchmarks.md). Wall times are reported
in wall seconds, and also in modelled seconds (wall / scale) to compare scales.
``--repeat N`` runs the configs N times, interleaved (A B C, A B C, ...) so a machine that slows down
or speeds up during the bench weighs on every config alike; it prints every run, then each config's
median wall time and how it compares with every other config's median (one bench run, N samples).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench import write_result
from bench.sim_to_live import rescaled
from services.launcher import run_job
from shared.config import load_config
from shared.vocab import AuditKind

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ("configs/sim_16_16_static.yaml", "configs/sim_8_24_static.yaml",
                   "configs/sim_16_16_dynamic.yaml", "configs/sim_16_16_adaptive.yaml")
MEAN_METRICS = {
    "mq_size": "dynamic_resource/mq_size",
    "resource_utilization": "dynamic_resource/resource_utilization",
    "train_utilization": "dynamic_resource/train_resource_utilization",
    "rollout_utilization": "dynamic_resource/rollout_resource_utilization",
    "trainer_idle_ratio": "fully_async/trainer/idle_ratio",
    "rollouter_idle_ratio": "fully_async/rollouter/idle_ratio",
}


def metric_means(path: Path) -> dict[str, float | None]:
    """Per-cycle mean of each metric in MEAN_METRICS (None when no cycle reported it)."""
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    means: dict[str, float | None] = {}
    for short, key in MEAN_METRICS.items():
        values = [float(row[key]) for row in rows if row.get(key) is not None]
        means[short] = sum(values) / len(values) if values else None
    return means


def startup_s(out_dir: Path, started_at: float | None) -> float | None:
    """Wall seconds from the launch to the controller's first decision or command's start (processes
    starting, imports, engines loading: the same work whatever the policy; the planner's t = 0)."""
    path = out_dir / "audit.jsonl"
    if started_at is None or not path.exists():
        return None
    for line in path.read_text().splitlines():
        event = json.loads(line) if line.strip() else {}
        first_action = event.get("kind") in (AuditKind.DECISION, AuditKind.COMMAND)
        if event.get("subject") == "controller" and first_action:
            began = float(event["t"]) - float(event.get("duration_s") or 0.0)  # a command's t is its end
            return round(began - started_at, 3)
    return None


def run_config(config_path: Path, out_dir: Path, *, timeout_s: float,
               time_scale: float | None = None) -> dict[str, Any]:
    """One config end to end (at `time_scale` instead of its own, if given: a rescaled copy in `out_dir`)."""
    started = time.monotonic()
    run_path = config_path
    if time_scale is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        run_path = rescaled(config_path, out_dir, time_scale=time_scale)
    summary = run_job(run_path, out_dir, progress=False, timeout_s=timeout_s)
    samples, switches = summary.get("samples", {}), summary.get("switches", {})
    scale = load_config(run_path).run.time_scale
    wall_s = summary.get("wall_time_s")
    return {
        "config": str(config_path),
        "time_scale": scale,
        "wall_time_s": wall_s,
        "modelled_s": None if wall_s is None else round(wall_s / scale, 1),
        "startup_s": startup_s(out_dir, float(summary["started_at"]) if "started_at" in summary else None),
        "launcher_total_s": round(time.monotonic() - started, 3),
        "param_versions": summary.get("param_versions"),
        "replicas": summary.get("replicas"),
        "samples": samples,
        "activations": switches.get("activations"),
        "deactivations": switches.get("deactivations"),
        "num_cycles": summary.get("num_cycles"),
        "means": metric_means(out_dir / "metrics.jsonl"),
        "out_dir": str(out_dir),
    }


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'config':22s} {'wall s':>7s} {'model s':>8s} {'start s':>7s} {'vers':>4s} {'trained':>7s} "
          f"{'lost':>4s} {'drop':>4s} {'act':>4s} {'deact':>5s} {'mq_size':>7s} {'res_util':>8s} "
          f"{'train_u':>7s} {'roll_u':>7s}")
    for row in rows:
        m, s = row["means"], row["samples"]
        print(f"{Path(row['config']).stem:22s} {fmt(row['wall_time_s'], '7.1f')} "
              f"{fmt(row['modelled_s'], '8.1f')} {fmt(row['startup_s'], '7.1f')} "
              f"{fmt(row['param_versions'], '4d')} "
              f"{fmt(s.get('trained'), '7d')} {fmt(s.get('lost'), '4d')} {fmt(s.get('dropped'), '4d')} "
              f"{fmt(row['activations'], '4d')} {fmt(row['deactivations'], '5d')} "
              f"{fmt(m['mq_size'], '7.1f')} "
              f"{fmt(m['resource_utilization'], '8.3f')} {fmt(m['train_utilization'], '7.3f')} "
              f"{fmt(m['rollout_utilization'], '7.3f')}")


def median_walls(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each config's median wall time over its runs that finished with one (config order kept)."""
    walls: dict[str, list[float]] = {}
    for row in rows:
        values = walls.setdefault(Path(row["config"]).stem, [])
        if row["wall_time_s"] is not None:
            values.append(float(row["wall_time_s"]))
    return {stem: statistics.median(values) for stem, values in walls.items() if values}


def print_medians(medians: dict[str, float], repeats: int) -> None:
    print(f"median wall s over {repeats} runs, and each against the others' medians:")
    for stem, wall_s in medians.items():
        against = ", ".join(f"{(wall_s / other_s - 1):+.1%} vs {other}"
                            for other, other_s in medians.items() if other != stem)
        print(f"  {stem:22s} {wall_s:7.1f}  {against}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--config", action="append", type=Path, default=None,
                        help=f"config to run (repeatable); default: {', '.join(DEFAULT_CONFIGS)}")
    parser.add_argument("--runs-dir", type=Path, default=PROJECT_ROOT / "runs" / "bench_sim",
                        help="each run's outputs go to RUNS_DIR/<config stem>")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-config bound on the run")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="run every config at this run.time_scale (default: each config's own)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the configs this many times, interleaved; report each config's median")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    if args.timeout_s <= 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
    if args.time_scale is not None and args.time_scale <= 0:
        raise ValueError(f"--time-scale must be > 0, got {args.time_scale}")
    configs = args.config or [PROJECT_ROOT / c for c in DEFAULT_CONFIGS]
    missing = [str(c) for c in configs if not Path(c).exists()]
    if missing:
        raise SystemExit(f"config(s) not found: {', '.join(missing)}")
    load_before = os.getloadavg()
    rows = []
    for repeat in range(args.repeat):
        for config_path in configs:
            suffix = f"-r{repeat + 1}" if args.repeat > 1 else ""
            out_dir = args.runs_dir / (Path(config_path).stem + suffix)
            shutil.rmtree(out_dir, ignore_errors=True)  # only this bench's own earlier outputs
            print(f"running {config_path} -> {out_dir}", flush=True)
            rows.append(run_config(Path(config_path), out_dir, timeout_s=args.timeout_s,
                                   time_scale=args.time_scale))
    medians = median_walls(rows)
    result = {"cpus": os.cpu_count(), "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
              "repeat": args.repeat, "median_wall_time_s": medians, "runs": rows}
    print_table(rows)
    if args.repeat > 1:
        print_medians(medians, args.repeat)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
