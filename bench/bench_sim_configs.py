"""Wall times of the static and dynamic sim configs side by side, through the real launcher.

Where it sits: each config runs end to end with `services.launcher.run_job`
(embedded redis-server, one process per service and per replica, sim
engines and sim trainer), exactly as `dynsched run` does. From each run's
`summary.json` and `metrics.jsonl` this reports wall time, trained / lost
samples, activations / deactivations, and the per-cycle means of
`dynamic_resource/mq_size` and the utilization metrics.

Run: ``python -m bench.bench_sim_configs --out runs/bench_sim.json`` (each config
takes a few minutes; `--timeout-s` bounds each run, `--config` picks others).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench import write_result
from services.launcher import run_job

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


def run_config(config_path: Path, out_dir: Path, *, timeout_s: float) -> dict[str, Any]:
    started = time.monotonic()
    summary = run_job(config_path, out_dir, progress=False, timeout_s=timeout_s)
    samples, switches = summary.get("samples", {}), summary.get("switches", {})
    return {
        "config": str(config_path),
        "wall_time_s": summary.get("wall_time_s"),
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
    print(f"{'config':22s} {'wall s':>7s} {'vers':>4s} {'trained':>7s} {'lost':>4s} {'drop':>4s} {'act':>4s} "
          f"{'deact':>5s} {'mq_size':>7s} {'res_util':>8s} {'train_u':>7s} {'roll_u':>7s}")
    for row in rows:
        m, s = row["means"], row["samples"]
        print(f"{Path(row['config']).stem:22s} {fmt(row['wall_time_s'], '7.1f')} "
              f"{fmt(row['param_versions'], '4d')} "
              f"{fmt(s.get('trained'), '7d')} {fmt(s.get('lost'), '4d')} {fmt(s.get('dropped'), '4d')} "
              f"{fmt(row['activations'], '4d')} {fmt(row['deactivations'], '5d')} "
              f"{fmt(m['mq_size'], '7.1f')} "
              f"{fmt(m['resource_utilization'], '8.3f')} {fmt(m['train_utilization'], '7.3f')} "
              f"{fmt(m['rollout_utilization'], '7.3f')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--config", action="append", type=Path, default=None,
                        help=f"config to run (repeatable); default: {', '.join(DEFAULT_CONFIGS)}")
    parser.add_argument("--runs-dir", type=Path, default=PROJECT_ROOT / "runs" / "bench_sim",
                        help="each run's outputs go to RUNS_DIR/<config stem>")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-config bound on the run")
    args = parser.parse_args(argv)
    if args.timeout_s <= 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
    configs = args.config or [PROJECT_ROOT / c for c in DEFAULT_CONFIGS]
    missing = [str(c) for c in configs if not Path(c).exists()]
    if missing:
        raise SystemExit(f"config(s) not found: {', '.join(missing)}")
    load_before = os.getloadavg()
    rows = []
    for config_path in configs:
        out_dir = args.runs_dir / Path(config_path).stem
        shutil.rmtree(out_dir, ignore_errors=True)  # only this bench's own earlier outputs
        print(f"running {config_path} -> {out_dir}", flush=True)
        rows.append(run_config(Path(config_path), out_dir, timeout_s=args.timeout_s))
    result = {"cpus": os.cpu_count(), "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
              "runs": rows}
    print_table(rows)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
