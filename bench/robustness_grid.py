"""A policy against static fully-async on the same split, over a grid of workloads (issue 11, robustness).

Where it sits: a planner bench over `sim.run.simulate`, next to `bench/policy_sweep.py` (which runs the
shipped scenarios). This one varies one config along three axes the shipped scenarios do not cover
densely: the trainer's seconds per sample (from production-bound to consumption-bound), the staleness
threshold and the trigger, and prints the policy's wall time against static on the same split for every
point, then the worst. Robustness target: never more than 1% slower than static.

Run: ``python -m bench.robustness_grid [--config configs/sim_16_16_adaptive.yaml] [--policy adaptive]
[--prompts 1280] [--out FILE]`` (the default grid is 36 points x 2 runs, ~1 minute on a quiet machine).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from bench import write_result
from sim.run import simulate
from sim.scenario import load_scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRAINER_S_PER_SAMPLE = (6.0, 13.0, 20.0, 26.0, 40.0, 60.0)
STALENESS = (0.0, 0.5, 1.0)
TRIGGER = (2, 4)


def point(config: Path, policy: str, prompts: int, changes: dict[str, Any]) -> dict[str, Any]:
    """Wall seconds of static and of `policy` on the config's split with `changes` applied."""
    base = load_scenario(config).with_prompts(prompts).with_changes(changes)
    static_s = simulate(base.with_policy("static")).wall_s
    result = simulate(base.with_policy(policy))
    return {**changes, "static_s": static_s, "policy_s": result.wall_s, "activations": result.activations,
            "vs_static": result.wall_s / static_s - 1.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "sim_16_16_adaptive.yaml")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--prompts", type=int, default=1280)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for per_sample_s, staleness, trigger in itertools.product(TRAINER_S_PER_SAMPLE, STALENESS, TRIGGER):
        changes = {"trainer.time_per_sample_s": per_sample_s,
                   "async_training.staleness_threshold": staleness,
                   "async_training.trigger_parameter_sync_step": trigger}
        row = point(args.config, args.policy, args.prompts, changes)
        rows.append(row)
        print(f"trainer {per_sample_s:5.1f} s/sample  staleness {staleness:.1f}  trigger {trigger}:  "
              f"static {row['static_s']:9.1f} s  {args.policy} {row['policy_s']:9.1f} s  "
              f"{100 * row['vs_static']:+6.1f}%  ({row['activations']} activations)", flush=True)
    worst = max(rows, key=lambda r: r["vs_static"])
    print(f"worst: {100 * worst['vs_static']:+.1f}% at "
          + ", ".join(f"{k}={v}" for k, v in worst.items() if "." in k))
    write_result(args.out, {"config": str(args.config), "policy": args.policy, "prompts": args.prompts,
                            "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
