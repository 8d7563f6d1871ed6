"""How far a policy is from the best fixed schedule, and what the best fixed schedule can gain at all.

Where it sits: a planner bench over `sim.run.simulate` (the services' own orchestration on the
virtual clock), next to `bench/policy_sweep.py` (policies x splits) and `bench/robustness_grid.py`
(workload axes). It answers the question a user asks before tuning a policy: is the policy leaving
gain on the table, or does the workload itself cap what lending the trainer's GPUs can buy?

For one config on its own split it simulates, over several seeds,

- `static` (plain fully-async) and the policy asked for (`adaptive` by default);
- every schedule of a two-threshold family on the seed's API (`ThresholdSchedule`): activate after a
  sync iff fewer than A samples are queued, deactivate once X are queued, with A and X multiples of
  `required_samples` (A = "always" activates at every sync). `fixed_ratio` is the A = X diagonal.
  The best of these is found by looking at every seed's outcome: a hindsight choice no live
  controller can make, so it is a reference to measure a policy against, not a policy;
- the same grid with free switches (`--free-switches`: wake, sleep and the trainer's offload cost
  0 s), the part of the gap the switch mechanics could close at best.

Each row is the mean over the seeds of wall time against static on the same seed.

Run: ``python -m bench.schedule_ceiling [--config FILE] [--policy adaptive] [--seeds 3]
[--prompts N] [--free-switches] [--table] [--set KEY=VALUE ...] [--out FILE]`` (~2 min for a 40-version
sim config on 2 cores; the seed scenario takes ~4 s per run, so give it `--seeds 1`). ``--table`` prints
every schedule's mean, so the shape around the best shows (a sharp optimum is a hindsight pick).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from bench import parse_sets, write_result
from policies.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ACTIVATE_BELOW = (1.0, 1.5, 2.0, 3.0, float("inf"))
"""A, in multiples of required_samples (inf: activate at every sync while prompts are fed)."""
DEACTIVATE_AT = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
"""X, in multiples of required_samples."""
FREE_SWITCHES = {"rollout.sim.wake_s": 0.0, "rollout.sim.sleep_s": 0.0, "trainer.offload_s": 0.0}


class ThresholdSchedule(DynamicSchedulePolicyBase):
    """Activate iff fewer than `activate_below` x required samples are queued at the sync; deactivate
    once `deactivate_at` x required are queued. Subclassed per grid point (the seed's constructor
    takes no thresholds), never registered outside this bench."""

    activate_below = 1.0
    deactivate_at = 1.0

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool,
                          ctx: DynamicScheduleContext) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return int(self.deactivate_at * ctx.required_samples)

    def should_activate_after_step(self, global_steps: int, is_hybrid_active: bool,
                                   ctx: DynamicScheduleContext) -> bool:
        return not ctx.feed_done and ctx.queued_samples < self.activate_below * ctx.required_samples


def threshold_policy(activate_below: float, deactivate_at: float) -> str:
    """Register the grid point's schedule; its policy name."""
    below = "always" if activate_below == float("inf") else f"{activate_below:g}"
    name = f"threshold_a{below}_x{deactivate_at:g}"
    cls = type(name, (ThresholdSchedule,), {"activate_below": activate_below, "deactivate_at": deactivate_at})
    register_policy(name)(cls)
    return name


def mean_vs_static(base: Scenario, policy: str, seeds: list[int], static_s: list[float],
                   changes: dict[str, Any]) -> dict[str, Any]:
    """Mean over seeds of the policy's wall time against static on the same seed, and its activations."""
    ratios, activations = [], []
    for seed, static in zip(seeds, static_s, strict=True):
        result = simulate(base.with_changes({**changes, "run.seed": seed}).with_policy(policy))
        ratios.append(result.wall_s / static - 1.0)
        activations.append(result.activations)
    return {"policy": policy, "vs_static": sum(ratios) / len(ratios), "per_seed": ratios,
            "activations": sum(activations) / len(activations)}


def ceiling(base: Scenario, *, policy: str, seeds: list[int], free_switches: bool) -> dict[str, Any]:
    static_s = [simulate(base.with_changes({"run.seed": s}).with_policy("static")).wall_s for s in seeds]
    rows = {"policy": mean_vs_static(base, policy, seeds, static_s, {})}
    grids: dict[str, list[dict[str, Any]]] = {}
    variants = {"as configured": {}, **({"free switches": FREE_SWITCHES} if free_switches else {})}
    for label, changes in variants.items():
        grid = [mean_vs_static(base, threshold_policy(a, x), seeds, static_s, changes)
                for a, x in itertools.product(ACTIVATE_BELOW, DEACTIVATE_AT)]
        grids[label] = grid
        rows[f"best fixed schedule, {label}"] = min(grid, key=lambda row: row["vs_static"])
        if free_switches and not changes:
            rows["policy, free switches"] = mean_vs_static(base, policy, seeds, static_s, FREE_SWITCHES)
    return {"static_s": static_s, "rows": rows, "grids": grids}


def format_grid(grid: list[dict[str, Any]]) -> str:
    """Every schedule's mean against static: one row per A, one column per X (multiples of required)."""
    lines = ["  A \\ X   " + " ".join(f"{x:>7g}" for x in DEACTIVATE_AT)]
    for index, activate_below in enumerate(ACTIVATE_BELOW):
        row = grid[index * len(DEACTIVATE_AT):(index + 1) * len(DEACTIVATE_AT)]
        label = "always" if activate_below == float("inf") else f"{activate_below:g}"
        lines.append(f"  {label:<8} " + " ".join(f"{100 * r['vs_static']:+6.1f}%" for r in row))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "sim_16_16_adaptive.yaml")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=0, help="total_rollout_steps (0: the config's)")
    parser.add_argument("--free-switches", action="store_true")
    parser.add_argument("--table", action="store_true",
                        help="print every schedule of the grid, not only the best")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.seeds < 1:
        raise SystemExit("--seeds must be >= 1")
    base = load_scenario(args.config)
    if args.prompts:
        base = base.with_prompts(args.prompts)
    if args.set:
        base = base.with_changes(parse_sets(args.set))
    seeds = list(range(args.seeds))
    result = ceiling(base, policy=args.policy, seeds=seeds, free_switches=args.free_switches)
    print(f"{args.config.name}: {base.config.data.total_rollout_steps} prompts, seeds {seeds}, "
          f"static {', '.join(f'{s:.0f}' for s in result['static_s'])} s")
    for label, row in result["rows"].items():
        print(f"  {label:<36} {row['policy']:<28} {100 * row['vs_static']:+6.1f}% vs static "
              f"({', '.join(f'{100 * r:+.1f}' for r in row['per_seed'])}), "
              f"{row['activations']:.1f} activations")
    for label, grid in result["grids"].items() if args.table else ():
        print(f"every fixed schedule, {label} (mean vs static; A: activate below A x required queued, "
              f"X: deactivate at X x required):\n{format_grid(grid)}")
    write_result(args.out, {"config": str(args.config), "prompts": base.config.data.total_rollout_steps,
                            "seeds": seeds, **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
