"""Sim-to-live agreement: one config through `dynsched run` (sim engines, time-scaled) and the planner.

Where it sits: the services and the simulator drive the same core objects (core.trainer_cycle,
core.executor, core.sample_lifecycle) and the same timing model (the sim engine's decode step, the
sim trainer's time per sample), so the two must tell the same story. For each config this runs it
end to end with `services.launcher.run_job` and through `sim.run.simulate`, and compares

- wall time of the versions after the first (first to last cycle), in modelled seconds (live wall
  seconds / run.time_scale): process start-up and the first version's warm-up are left out;
- hybrid activations over the run;
- mean `dynamic_resource/mq_size` over the cycles.

Targets (issue 10): wall within 10%, activations within 20% (or within 1 when both are small),
mean mq_size within 20% (or within 2 samples when both are small).

Run: ``python -m bench.sim_to_live [--config FILE ...] [--time-scale 0.1] [--set KEY=VALUE ...]
[--versions] [--out FILE] [--runs-dir DIR]`` (the seed-shaped configs/sim_* take ~2 wall minutes each at their
time_scale 0.05, ~4 at 0.1). A scenario is a config too; ``--set`` changes a key of every config
(repeatable, YAML values), e.g. shorten ``scenarios/seed_qwen35_35b_a3b_32xh20.yaml`` with
``--set data.total_rollout_steps=640``.
The live system's own cost (Redis round trips, polls, CPU contention) is wall seconds per version,
so its share of a version falls as time_scale grows; each row reports it (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench import parse_sets, write_result
from core.metrics import SAMPLE_LAG_MEAN
from services.launcher import run_job
from shared.config import load_config
from sim.run import simulate
from sim.scenario import Scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ("configs/sim_16_16_static.yaml", "configs/sim_8_24_static.yaml",
                   "configs/sim_16_16_dynamic.yaml", "configs/sim_16_16_adaptive.yaml")
WALL_TOLERANCE, ACTIVATION_TOLERANCE, MQ_TOLERANCE = 0.10, 0.20, 0.20
LAG_TOLERANCE_VERSIONS = 0.1
"""Mean version lag of trained samples: live and planner within this many versions (not an issue target:
both follow the staleness limit, so they agree exactly while the rollouter reaches it)."""


PER_VERSION_KEYS = ("timing_s/step", "dynamic_resource/train_compute_time_s", "timing_s/gen",
                    "timing_s/param_sync", "timing_s/deactivate",
                    "timing_s/wait_for_enough_samples", "dynamic_resource/mq_size",
                    "fully_async/rollouter/idle_ratio")
"""Per-version metrics shown side by side (``--versions``): where the two stories part."""


def _story(times_s: list[float], cycles: list[dict[str, float]], activations: int, sample_lag: float,
           seconds_per_unit: float = 1.0) -> dict[str, Any]:
    mq = [c["dynamic_resource/mq_size"] for c in cycles]
    def scaled(key: str, cycle: dict[str, float]) -> float:
        seconds = key.startswith("timing_s/") or key.endswith("_time_s")
        return cycle.get(key, float("nan")) / (seconds_per_unit if seconds else 1.0)

    per_version = [{"version_s": t - times_s[i - 1] if i else float("nan"),
                    **{key: scaled(key, c) for key in PER_VERSION_KEYS}}
                   for i, (t, c) in enumerate(zip(times_s, cycles, strict=True))]
    return {"wall_after_first_version_s": times_s[-1] - times_s[0], "activations": float(activations),
            "mean_mq_size": sum(mq) / len(mq), "mean_sample_lag": sample_lag, "versions": float(len(times_s)),
            "per_version": per_version}


def planned(config_path: Path) -> dict[str, Any]:
    res = simulate(Scenario.from_config(load_config(config_path)))
    return _story([c["time_s"] for c in res.cycles], res.cycles, res.activations, res.mean_sample_lag())


def live(config_path: Path, out_dir: Path, *, timeout_s: float) -> dict[str, Any]:
    config = load_config(config_path)
    summary = run_job(config_path, out_dir, fresh=True, progress=False, timeout_s=timeout_s)
    text = (out_dir / "metrics.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    scale = config.run.time_scale
    lags = [line[SAMPLE_LAG_MEAN] for line in lines]  # every cycle trains as many samples: a mean of means
    return _story([line["t"] / scale for line in lines], lines, int(summary["switches"]["activations"] or 0),
                  sum(lags) / len(lags), seconds_per_unit=scale)


def agreement(sim: dict[str, Any], run: dict[str, Any]) -> dict[str, bool]:
    def close(key: str, rel: float, slack: float) -> bool:
        return abs(sim[key] - run[key]) <= max(rel * max(abs(run[key]), abs(sim[key])), slack)

    return {"wall": close("wall_after_first_version_s", WALL_TOLERANCE, 0.0),
            "activations": close("activations", ACTIVATION_TOLERANCE, 1.0),
            "mean_mq_size": close("mean_mq_size", MQ_TOLERANCE, 2.0),
            "mean_sample_lag": close("mean_sample_lag", 0.0, LAG_TOLERANCE_VERSIONS)}


def rescaled(config_path: Path, out_dir: Path, *, time_scale: float | None = None, namespace: str = "",
             changes: dict[str, Any] | None = None) -> Path:
    """A copy of the config in `out_dir` with another run.time_scale (and Redis namespace, and dotted
    keys, if given); `load_config` validates it."""
    raw = yaml.safe_load(config_path.read_text())
    every = {**({"run.time_scale": time_scale} if time_scale is not None else {}),
             **({"run.namespace": namespace} if namespace else {}), **(changes or {})}
    for dotted, value in every.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = out_dir / f"{config_path.stem}_ts{float(raw.get('run', {}).get('time_scale', 1.0)):g}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def compare(config_path: Path, *, timeout_s: float = 900.0, runs_dir: Path | None = None) -> dict[str, Any]:
    """Both runs of one config, the agreement, the live system's own cost per version (its extra
    length over the planner's, in wall seconds: Redis round trips, polls, CPU contention) and the
    machine's 1-minute load average before and after the live run (this machine is shared). The
    live run's directory (audit, metrics, logs) is kept under `runs_dir` if given."""
    load_before = os.getloadavg()[0]
    if runs_dir is not None:
        run = live(config_path, runs_dir / config_path.stem, timeout_s=timeout_s)
    else:
        with tempfile.TemporaryDirectory(prefix="sim_to_live_") as tmp:
            run = live(config_path, Path(tmp), timeout_s=timeout_s)
    load_after = os.getloadavg()[0]
    sim = planned(config_path)
    extra_s = run["wall_after_first_version_s"] - sim["wall_after_first_version_s"]
    wall_s_per_version = extra_s * load_config(config_path).run.time_scale / max(1.0, run["versions"] - 1)
    return {"config": str(config_path), "live": run, "planner": sim, "agree": agreement(sim, run),
            "live_overhead_wall_s_per_version": wall_s_per_version, "load": [load_before, load_after]}


def format_row(row: dict[str, Any]) -> str:
    run, sim = row["live"], row["planner"]
    parts = [f"{Path(row['config']).name:<26}"]
    for key, label in (("wall_after_first_version_s", "wall s"), ("activations", "activ."),
                       ("mean_mq_size", "mean mq"), ("mean_sample_lag", "lag v.")):
        err = sim[key] / run[key] - 1.0 if run[key] else 0.0
        parts.append(f"{label} live {run[key]:8.1f} sim {sim[key]:8.1f} ({err:+.1%})")
    parts.append(f"live overhead {row['live_overhead_wall_s_per_version']:.2f} wall s/version, "
                 f"load {row['load'][0]:.1f}-{row['load'][1]:.1f}")
    parts.append("agree" if all(row["agree"].values()) else f"DISAGREE {row['agree']}")
    return " | ".join(parts)


def format_versions(row: dict[str, Any]) -> str:
    """One line per version: live / planner for the version's length and PER_VERSION_KEYS."""
    keys = ("version_s", *PER_VERSION_KEYS)
    lines = ["v  " + " ".join(f"{key.rsplit('/', 1)[-1][:14]:>15}" for key in keys)]
    for v, (run, sim) in enumerate(zip(row["live"]["per_version"], row["planner"]["per_version"],
                                       strict=False), start=1):
        lines.append(f"{v:<2} " + " ".join(f"{run[key]:7.1f}/{sim[key]:<7.1f}" for key in keys))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", default=[],
                        help="configs (default: the seed-shaped sim_*)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="keep each live run's directory (audit.jsonl, metrics, logs) under this one")
    parser.add_argument("--versions", action="store_true", help="also print live/planner per version")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="run every config at this run.time_scale instead of its own")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a dotted config key of every config (repeatable, YAML value)")
    args = parser.parse_args(argv)
    changes = parse_sets(args.set)
    paths = [PROJECT_ROOT / c for c in (args.config or DEFAULT_CONFIGS)]  # an absolute c stays itself
    with tempfile.TemporaryDirectory(prefix="sim_to_live_configs_") as tmp:
        if args.time_scale is not None or changes:
            paths = [rescaled(path, Path(tmp), time_scale=args.time_scale, changes=changes) for path in paths]
        rows = [compare(path, timeout_s=args.timeout_s, runs_dir=args.runs_dir) for path in paths]
    for row in rows:
        print(format_row(row))
        if args.versions:
            print(format_versions(row))
    write_result(args.out, {"rows": rows})
    return 0 if all(all(r["agree"].values()) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
