"""A policy against static fully-async on the same split, over a grid of workloads (issue 11, robustness).

Where it sits: a planner bench over `sim.run.simulate`, next to `bench/policy_sweep.py` (which runs the
shipped scenarios). This one varies one config along axes the shipped scenarios do not cover
densely, and prints the policy's wall time against static on the same split for every point, then
the worst. Robustness target: never more than 1% slower than static. Two grids (`--grid`):

- `workload` (default): the trainer's seconds per sample (from production-bound to consumption-bound),
  the staleness threshold and the trigger;
- `switch_costs`: the switch mechanics' costs (hybrid wake = sleep, the trainer's offload, the weight sync:
  a large model's switches take tens of seconds) at three trainer speeds.

Run: ``python -m bench.robustness_grid [--grid workload|switch_costs]
[--config configs/sim_16_16_adaptive.yaml] [--policy adaptive] [--prompts 1280] [--out FILE]`` (each
grid is 36 points x 2 runs, ~1 minute on a quiet machine).
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
WAKE_SLEEP_S = (1.0, 10.0, 30.0)
OFFLOAD_S = (0.0, 15.0)
WEIGHT_SYNC_S = (2.0, 20.0)
SWITCH_TRAINER_S_PER_SAMPLE = (13.0, 26.0, 60.0)


def grid(name: str) -> list[dict[str, Any]]:
    """The config changes of every point of grid `name`."""
    if name == "switch_costs":
        return [{"rollout.sim.wake_s": wake_sleep, "rollout.sim.sleep_s": wake_sleep,
                 "trainer.offload_s": offload, "rollout.sim.weight_sync_s": sync,
                 "trainer.time_per_sample_s": per_sample}
                for wake_sleep, offload, sync, per_sample in itertools.product(
                    WAKE_SLEEP_S, OFFLOAD_S, WEIGHT_SYNC_S, SWITCH_TRAINER_S_PER_SAMPLE)]
    return [{"trainer.time_per_sample_s": per_sample, "async_training.staleness_threshold": staleness,
             "async_training.trigger_parameter_sync_step": trigger}
            for per_sample, staleness, trigger in itertools.product(TRAINER_S_PER_SAMPLE, STALENESS, TRIGGER)]


def point(config: Path, policy: str, prompts: int, changes: dict[str, Any]) -> dict[str, Any]:
    """Wall seconds of static and of `policy` on the config's split with `changes` applied."""
    base = load_scenario(config).with_prompts(prompts).with_changes(changes)
    static_s = simulate(base.with_policy("static")).wall_s
    result = simulate(base.with_policy(policy))
    return {**changes, "static_s": static_s, "policy_s": result.wall_s, "activations": result.activations,
            "vs_static": result.wall_s / static_s - 1.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--grid", choices=("workload", "switch_costs"), default="workload")
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "sim_16_16_adaptive.yaml")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--prompts", type=int, default=1280)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for changes in grid(args.grid):
        row = point(args.config, args.policy, args.prompts, changes)
        rows.append(row)
        where = "  ".join(f"{key.rsplit('.', 1)[-1]} {value:g}" for key, value in changes.items())
        print(f"{where}:  static {row['static_s']:9.1f} s  {args.policy} {row['policy_s']:9.1f} s  "
              f"{100 * row['vs_static']:+6.1f}%  ({row['activations']} activations)", flush=True)
    worst = max(rows, key=lambda r: r["vs_static"])
    print(f"worst: {100 * worst['vs_static']:+.1f}% at "
          + ", ".join(f"{k}={v}" for k, v in worst.items() if "." in k))
    write_result(args.out, {"config": str(args.config), "grid": args.grid, "policy": args.policy,
                            "prompts": args.prompts, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
