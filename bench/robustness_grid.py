"""A policy against static fully-async on the same split, over a grid of workloads (issue 11, robustness).

Where it sits: a planner bench over `sim.run.simulate`, next to `bench/policy_sweep.py` (which runs the
shipped scenarios). This one varies one config along axes the shipped scenarios do not cover
densely, and prints the policy's wall time against static on the same split for every point, then
the worst. Robustness target: never more than 1% slower than static. Three grids (`--grid`):

- `workload` (default): the trainer's seconds per sample (from production-bound to consumption-bound),
  the staleness threshold and the trigger;
- `switch_costs`: the switch mechanics' costs (hybrid wake = sleep, the trainer's offload, the weight sync:
  a large model's switches take tens of seconds) at three trainer speeds;
- `trigger`: the flow-control settings alone (staleness 0 / 0.25 / 0.5 / 1 x trigger 1 / 2 / 4 / 8), the
  config's own trainer: a small trigger makes every cycle short against the switch and the latency;
- `shape`: the batch's shape, which no other grid moves: responses per prompt (n 4 / 16), mini-batches per
  micro-step (require_batches 1 / 2), prompts per mini-batch (8 / 32), prompts per replica (8 / 32);
- `concurrency`: the samples in flight per replica (8 to 48) at three trainer speeds: past the engine's
  running cap the standalones' batches stay full, and the hybrids have less idle capacity to fill;
- `random`: `--points` points drawn (`--seed`) from every axis above at once, so the axes the other
  grids keep apart meet (a large model's slow switches with a small trigger, a short run, a wide batch):
  the combinations a held-back scenario may bring.

Run: ``python -m bench.robustness_grid [--grid workload|switch_costs|trigger|shape|concurrency]
[--config configs/sim_16_16_adaptive.yaml ...] [--policy adaptive] [--prompts 1280|0] [--points N --seed S]
[--out FILE]``
(`--config` repeats; a scenario file works too; each grid is 16-36 points x 2 runs, ~1 minute per config
on a quiet machine).
"""

from __future__ import annotations

import argparse
import itertools
import random
from pathlib import Path
from statistics import fmean
from typing import Any

from bench import write_result
from sim.cli import positive_int
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRAINER_S_PER_SAMPLE = (6.0, 13.0, 20.0, 26.0, 40.0, 60.0)
STALENESS = (0.0, 0.5, 1.0)
TRIGGER = (2, 4)
WAKE_SLEEP_S = (1.0, 10.0, 30.0)
OFFLOAD_S = (0.0, 15.0)
WEIGHT_SYNC_S = (2.0, 20.0)
SWITCH_TRAINER_S_PER_SAMPLE = (13.0, 26.0, 60.0)
FLOW_STALENESS = (0.0, 0.25, 0.5, 1.0)
FLOW_TRIGGER = (1, 2, 4, 8)
SHAPE_N = (4, 16)
SHAPE_REQUIRE_BATCHES = (1, 2)
SHAPE_MINI_BATCH = (8, 32)
SHAPE_SAMPLES_PER_REPLICA = (8, 32)
CONCURRENCY_SAMPLES_PER_REPLICA = (8, 12, 16, 20, 24, 32, 48)
CONCURRENCY_TRAINER_S_PER_SAMPLE = (13.0, 26.0, 60.0)
GRIDS = ("workload", "switch_costs", "trigger", "shape", "concurrency", "random")
AXES: dict[str, tuple[Any, ...]] = {
    "trainer.time_per_sample_s": TRAINER_S_PER_SAMPLE,
    "async_training.staleness_threshold": FLOW_STALENESS,
    "async_training.trigger_parameter_sync_step": FLOW_TRIGGER,
    "rollout.sim.wake_s": WAKE_SLEEP_S,
    "trainer.offload_s": OFFLOAD_S,
    "rollout.sim.weight_sync_s": WEIGHT_SYNC_S,
    "data.n": SHAPE_N,
    "async_training.require_batches": SHAPE_REQUIRE_BATCHES,
    "trainer.ppo_mini_batch_size": SHAPE_MINI_BATCH,
    "async_training.concurrent_samples_per_replica": CONCURRENCY_SAMPLES_PER_REPLICA,
}
"""Every axis the structured grids move, with their values: what the `random` grid draws from."""


def random_points(points: int, seed: int) -> list[dict[str, Any]]:
    """`points` draws of one value per axis of AXES (the hybrids' sleep takes their wake's value)."""
    rng = random.Random(seed)
    drawn = [{key: rng.choice(values) for key, values in AXES.items()} for _ in range(points)]
    return [{**changes, "rollout.sim.sleep_s": changes["rollout.sim.wake_s"]} for changes in drawn]


def grid(name: str, *, points: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """The config changes of every point of grid `name` (`random`: `points` draws with `seed`)."""
    if name == "random":
        return random_points(points, seed)
    if name == "switch_costs":
        return [{"rollout.sim.wake_s": wake_sleep, "rollout.sim.sleep_s": wake_sleep,
                 "trainer.offload_s": offload, "rollout.sim.weight_sync_s": sync,
                 "trainer.time_per_sample_s": per_sample}
                for wake_sleep, offload, sync, per_sample in itertools.product(
                    WAKE_SLEEP_S, OFFLOAD_S, WEIGHT_SYNC_S, SWITCH_TRAINER_S_PER_SAMPLE)]
    if name == "shape":
        return [{"data.n": n, "async_training.require_batches": batches,
                 "trainer.ppo_mini_batch_size": mini_batch,
                 "async_training.concurrent_samples_per_replica": per_replica}
                for n, batches, mini_batch, per_replica in itertools.product(
                    SHAPE_N, SHAPE_REQUIRE_BATCHES, SHAPE_MINI_BATCH, SHAPE_SAMPLES_PER_REPLICA)]
    if name == "concurrency":
        return [{"async_training.concurrent_samples_per_replica": per_replica,
                 "trainer.time_per_sample_s": per_sample}
                for per_replica, per_sample in itertools.product(
                    CONCURRENCY_SAMPLES_PER_REPLICA, CONCURRENCY_TRAINER_S_PER_SAMPLE)]
    if name == "trigger":
        return [{"async_training.staleness_threshold": staleness,
                 "async_training.trigger_parameter_sync_step": trigger}
                for staleness, trigger in itertools.product(FLOW_STALENESS, FLOW_TRIGGER)]
    return [{"trainer.time_per_sample_s": per_sample, "async_training.staleness_threshold": staleness,
             "async_training.trigger_parameter_sync_step": trigger}
            for per_sample, staleness, trigger in itertools.product(TRAINER_S_PER_SAMPLE, STALENESS, TRIGGER)]


def point(config: Path, policy: str, prompts: int, changes: dict[str, Any], *,
          workload_seeds: int = 1) -> dict[str, Any]:
    """Wall seconds of static and of `policy` on the config's split with `changes` applied; with
    `workload_seeds` > 1, the means over that many workload draws (the config's seed and the next ones),
    `vs_static` the mean of each draw's ratio and `vs_static_spread` their range."""
    base = load_scenario(config)
    base = (base.with_prompts(prompts) if prompts else base).with_changes(changes)
    draws = [_draw(base.with_seed(base.seed + i), policy) for i in range(workload_seeds)]
    ratios = [d["vs_static"] for d in draws]
    return {**changes, "static_s": fmean(d["static_s"] for d in draws),
            "policy_s": fmean(d["policy_s"] for d in draws),
            "activations": round(fmean(d["activations"] for d in draws)),
            "start_up_only": all(d["start_up_only"] for d in draws),
            "vs_static": fmean(ratios), "vs_static_spread": max(ratios) - min(ratios)}


def _draw(scenario: Scenario, policy: str) -> dict[str, Any]:
    static_s = simulate(scenario.with_policy("static")).wall_s
    result = simulate(scenario.with_policy(policy))
    first = result.decisions[0] if result.decisions else {}
    return {"static_s": static_s, "policy_s": result.wall_s, "activations": result.activations,
            "start_up_only": result.activations == 1 and first.get("decision") == "activate"
            and first.get("version") == 0,
            "vs_static": result.wall_s / static_s - 1.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--grid", choices=GRIDS, default="workload")
    parser.add_argument("--config", type=Path, action="append", default=None,
                        help="a run config or scenario (repeat it; default the live adaptive config)")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--prompts", type=int, default=1280,
                        help="total_rollout_steps of every point (0: each config's own, the run as it "
                             "would be trained: a switch made once, such as the start-up activation, "
                             "weighs less)")
    parser.add_argument("--points", type=int, default=40, help="points of the random grid")
    parser.add_argument("--seed", type=int, default=0, help="the random grid's draw")
    parser.add_argument("--workload-seeds", type=positive_int, default=1,
                        help="judge each point on the mean over this many workload draws (run.seed and "
                             "the next ones): a latency-bound point's gap on one draw is partly chance")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    configs = args.config or [PROJECT_ROOT / "configs" / "sim_16_16_adaptive.yaml"]
    rows = []
    for config in configs:
        for changes in grid(args.grid, points=args.points, seed=args.seed):
            row = {"config": str(config), **point(config, args.policy, args.prompts, changes,
                                                  workload_seeds=args.workload_seeds)}
            rows.append(row)
            where = "  ".join(f"{key.rsplit('.', 1)[-1]} {value:g}" for key, value in changes.items())
            print(f"{config.stem}  {where}:  static {row['static_s']:9.1f} s  {args.policy} "
                  f"{row['policy_s']:9.1f} s  {100 * row['vs_static']:+6.1f}%  "
                  f"({row['activations']} activations)", flush=True)
    for config in configs:
        print(summary_line(config, [row for row in rows if row["config"] == str(config)]))
    write_result(args.out, {"configs": [str(c) for c in configs], "grid": args.grid, "policy": args.policy,
                            "prompts": args.prompts, "points": args.points, "seed": args.seed,
                            "workload_seeds": args.workload_seeds, "rows": rows})
    return 0


def summary_line(config: Path, rows: list[dict[str, Any]]) -> str:
    """One config's worst point, mean and count of points over the 1% target, and how many of those
    switched once only, at the start-up (the activation taken before anything is measured)."""
    worst = max(rows, key=lambda r: r["vs_static"])
    mean = sum(r["vs_static"] for r in rows) / len(rows)
    over = [r for r in rows if r["vs_static"] > 0.01]
    start_up_only = sum(1 for r in over if r.get("start_up_only"))
    where = ", ".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in worst.items() if "." in k)
    return (f"{config.stem}: worst {100 * worst['vs_static']:+.1f}% at {where}; mean {100 * mean:+.1f}%; "
            f"{len(over)} of {len(rows)} points over +1% ({start_up_only} of them the start-up "
            f"activation alone)")


if __name__ == "__main__":
    raise SystemExit(main())
