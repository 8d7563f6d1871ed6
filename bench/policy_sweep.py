"""Every scenario x every registered policy x both switch mechanics, against the best static split.

Where it sits: a planner bench over `sim.run.simulate` (the services' own orchestration on the
virtual clock). For each config in `scenarios/` (or `--config`), at every train/rollout split the
planner considers (`sim.plan.splits`), it simulates plain fully-async (`static`) and every
registered policy twice: with the config's switch mechanics (`seed`: the seed's order) and with
the hybrid sync folded into the standalones' sync and the trainer's offload overlapped with the
wake (`fast`). It prints, per scenario and (policy, mechanics):

- `best h`: its fastest split, and that time against the best static split at the same GPU count;
- `worst vs static same split`: the largest slowdown against `static` on the same split (and the
  same samples in flight), over every split (the robustness check: a recommended policy should never
  be more than 1% slower).

`--concurrency 1,2` also searches the samples in flight per replica as `dynsched plan` does (multiples
of the config's `concurrent_samples_per_replica`), for static and the policies alike, so `best` and
`static h` are each the fastest over splits and samples in flight (a static baseline whose batches
are not full would flatter every dynamic policy). Default: the config's own value only.

Run: ``python -m bench.policy_sweep [--config FILE ...] [--policy P ...] [--prompts N]
[--concurrency 1,2] [--workers K] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import write_result
from sim.cli import parse_multiples
from sim.plan import concurrencies, dynamic_policies, splits
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MECHANICS: dict[str, dict[str, Any]] = {
    "seed": {},
    "fast": {"async_training.dynamic_schedule_fold_hybrid_sync": True,
             "async_training.dynamic_schedule_overlap_wake": True},
}
"""Config changes per mechanics variant ('seed': the config as written)."""


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    scenario: str
    train_gpus: int
    rollout_gpus: int
    policy: str
    mechanics: str
    concurrency: int
    """Samples in flight per replica (`async_training.concurrent_samples_per_replica`)."""
    wall_h: float
    activations: int


Job = tuple[str, int, int, str, str, int, int]
"""(config path, train GPUs, rollout GPUs, policy, mechanics, prompts (0: the config's), concurrency)."""


def _run(job: Job) -> SweepRow:
    path, train, rollout, policy, mechanics, prompts, concurrency = job
    scenario = load_scenario(path)
    if prompts:
        scenario = scenario.with_prompts(prompts)
    scenario = scenario.with_changes({"async_training.concurrent_samples_per_replica": concurrency})
    scenario = scenario.with_split(train, rollout, policy=policy)
    if MECHANICS[mechanics]:
        scenario = scenario.with_changes(MECHANICS[mechanics])
    result = simulate(scenario)
    return SweepRow(scenario=Path(path).stem, train_gpus=train, rollout_gpus=rollout, policy=policy,
                    mechanics=mechanics, concurrency=concurrency, wall_h=result.wall_s / 3600.0,
                    activations=result.activations)


def jobs_for(path: str, scenario: Scenario, *, prompts: int, policies: list[str] | None = None,
             concurrency: tuple[float, ...] = (1.0,)) -> list[Job]:
    jobs = []
    for c in concurrencies(scenario, concurrency):
        for train, rollout in splits(scenario):
            if rollout > 0:
                jobs.append((path, train, rollout, "static", "seed", prompts, c))
            for policy in policies or dynamic_policies():
                for mechanics in MECHANICS:
                    jobs.append((path, train, rollout, policy, mechanics, prompts, c))
    return jobs


def summarize(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """Per (scenario, policy, mechanics): its best run (split and samples in flight) vs the best static run,
    and its worst slowdown vs static on the same split at the same samples in flight."""
    out = []
    for scenario in sorted({r.scenario for r in rows}):
        mine = [r for r in rows if r.scenario == scenario]
        static = {_where(r): r.wall_h for r in mine if r.policy == "static"}
        best_static = min((r for r in mine if r.policy == "static"), key=lambda r: r.wall_h, default=None)
        best_static_h = best_static.wall_h if best_static else float("nan")
        for policy, mechanics in sorted({(r.policy, r.mechanics) for r in mine if r.policy != "static"}):
            runs = [r for r in mine if (r.policy, r.mechanics) == (policy, mechanics)]
            best = min(runs, key=lambda r: r.wall_h)
            same = [r.wall_h / static[_where(r)] - 1.0 for r in runs if _where(r) in static]
            out.append({"scenario": scenario, "policy": policy, "mechanics": mechanics,
                        "best_split": _label(best), "best_h": best.wall_h,
                        "best_static": _label(best_static) if best_static else "",
                        "best_static_h": best_static_h, "vs_best_static": best.wall_h / best_static_h - 1.0,
                        "worst_vs_static_same_split": max(same) if same else float("nan")})
    return out


def _where(row: SweepRow) -> tuple[int, int, int]:
    return row.train_gpus, row.rollout_gpus, row.concurrency


def _label(row: SweepRow) -> str:
    """The run's split and samples in flight per replica, e.g. `16:16 x32`."""
    return f"{row.train_gpus}:{row.rollout_gpus} x{row.concurrency}"


def print_tables(rows: list[SweepRow], summary: list[dict[str, Any]]) -> None:
    print(f"{'scenario':<34} {'split':>6} {'conc.':>5} {'policy':<19} {'mech':<5} {'wall h':>7} "
          f"{'activ.':>6}")
    for r in sorted(rows, key=lambda r: (r.scenario, r.train_gpus, r.concurrency, r.policy, r.mechanics)):
        print(f"{r.scenario:<34} {r.train_gpus:>2}:{r.rollout_gpus:<3} {r.concurrency:>5} {r.policy:<19} "
              f"{r.mechanics:<5} {r.wall_h:>7.3f} {r.activations:>6}")
    print()
    print(f"{'scenario':<34} {'policy':<19} {'mech':<5} {'best':>10} {'best h':>7} {'static':>10} "
          f"{'static h':>8} {'vs best static':>14} {'worst vs static same split':>26}")
    for s in summary:
        print(f"{s['scenario']:<34} {s['policy']:<19} {s['mechanics']:<5} {s['best_split']:>10} "
              f"{s['best_h']:>7.3f} {s['best_static']:>10} {s['best_static_h']:>8.3f} "
              f"{s['vs_best_static']:>+13.1%} {s['worst_vs_static_same_split']:>+25.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", action="append", default=None,
                        help="scenario/run config (repeatable); default: every scenarios/*.yaml")
    parser.add_argument("--prompts", type=int, default=0, help="override total_rollout_steps (quick looks)")
    parser.add_argument("--policy", action="append", default=None,
                        help="policy to sweep (repeatable); default: every registered one")
    parser.add_argument("--concurrency", type=parse_multiples, default=(1.0,),
                        help="multiples of concurrent_samples_per_replica to try, comma-separated "
                             "(default 1: the config's own)")
    parser.add_argument("--workers", type=int, default=None, help="parallel simulations (default: CPUs)")
    parser.add_argument("--out", type=Path, default=None, help="write rows and summary as JSON here")
    args = parser.parse_args(argv)
    paths = args.config or sorted(str(p) for p in (PROJECT_ROOT / "scenarios").glob("*.yaml"))
    jobs = [job for path in paths for job in jobs_for(path, load_scenario(path), prompts=args.prompts,
                                                 policies=args.policy, concurrency=args.concurrency)]
    workers = args.workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        rows = [_run(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(_run, jobs))
    summary = summarize(rows)
    print_tables(rows, summary)
    write_result(args.out, {"rows": [asdict(r) for r in rows], "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
