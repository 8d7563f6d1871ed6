"""Where a run's wall time goes, per sync cycle, in the planner (issue 11, step 1).

Where it sits: a planner bench over `sim.run.simulate` (the services' own orchestration on the
virtual clock). For each run asked for it prints the trainer's cycle split into what it did:
computing, waiting for samples with the hybrids lent (the deactivation's WaitForSamples), the
deactivation itself (the hybrids' sleep, and the trainer's onload where `dynamic_schedule_overlap_sleep`
runs it at once with the sleep), waiting in later collections (trainer idle), the sync (standalone sync
+ activation), `other` (the rest of `timing_s/step`: the trainer's onload after the sleep where the two
do not overlap), and the partial-rollout losses (tokens prefilled again after an abort, as a share of
the tokens decoded). All numbers are means over the run's cycles, in modelled
seconds; `activated` is the share of cycles that lent the hybrids.

Run: ``python -m bench.where_time_goes [--config FILE] [--policy P ...] [--split 16:16]
[--set KEY=VALUE ...] [--prompts N] [--out FILE]``. ``--set`` changes one config key (repeatable,
YAML values: ``--set async_training.dynamic_schedule_fold_hybrid_sync=true``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import parse_sets, write_result
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SEED = PROJECT_ROOT / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml"
PARTS = (("compute", "dynamic_resource/train_compute_time_s"),
         ("window", "timing_s/wait_for_enough_samples"),
         ("deactivate", "timing_s/deactivate"),
         ("collect_wait", "timing_s/gen"),
         ("sync", "timing_s/param_sync"))
"""(column, cycle metric): the parts of a trainer cycle, in the order the trainer meets them."""


def breakdown(scenario: Scenario) -> dict[str, Any]:
    """Per-cycle means of each part of the trainer's cycle, plus the run's totals."""
    result = simulate(scenario)
    cycles = result.cycles[1:] or result.cycles  # the first cycle holds the start-up wait
    means = {name: sum(c[key] for c in cycles) / len(cycles) for name, key in PARTS}
    step = sum(c["timing_s/step"] for c in cycles) / len(cycles)
    means["other"] = step - sum(means.values())
    decoded = result.tokens.get("decoded", 0.0)
    return {"wall_h": result.wall_s / 3600.0, "activations": result.activations, "cycle_s": step,
            "activated": sum(c["dynamic_schedule/activated"] for c in cycles) / len(cycles),
            "reprefilled_share": _reprefilled(result.tokens) / decoded if decoded else 0.0,
            **means}


def _reprefilled(tokens: dict[str, float]) -> float:
    """Tokens prefilled beyond each trajectory's prompt once (trained = prompts + responses, decoded =
    responses): what aborts cost in re-prefill."""
    return max(0.0, tokens.get("prefilled", 0.0) - (tokens.get("trained", 0.0) - tokens.get("decoded", 0.0)))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --set, --prompts, --out: what a planner bench over one config takes."""
    parser.add_argument("--config", type=Path, default=SEED)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompts", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)


def scenario_for(config: Path, *, policy: str, split: str = "", prompts: int = 0,
                 changes: dict[str, Any] | None = None) -> Scenario:
    """The config at `split` ("TRAIN:ROLLOUT", else the config's) under `policy`, shortened to
    `prompts` (0: the config's), with `changes` applied."""
    scenario = load_scenario(config)
    if prompts:
        scenario = scenario.with_prompts(prompts)
    if split:
        train, _, rollout = split.partition(":")
        scenario = scenario.with_split(int(train), int(rollout), policy=policy)
    else:
        scenario = scenario.with_policy(policy)
    return scenario.with_changes(changes) if changes else scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_run_arguments(parser)
    parser.add_argument("--policy", action="append", default=None, help="static | a policy (repeatable)")
    parser.add_argument("--split", default="", help="TRAIN:ROLLOUT GPUs (default: the config's)")
    args = parser.parse_args(argv)
    changes = parse_sets(args.set)
    rows = []
    for policy in args.policy or ["static", "adaptive"]:
        scenario = scenario_for(args.config, policy=policy, split=args.split, prompts=args.prompts,
                                changes=changes)
        rows.append({"policy": policy, **breakdown(scenario)})
    cols = ("wall_h", "activations", "activated", "cycle_s", *(n for n, _ in PARTS), "other",
            "reprefilled_share")
    print(f"{'policy':<20}" + "".join(f"{c[:12]:>13}" for c in cols))
    for row in rows:
        print(f"{row['policy']:<20}" + "".join(f"{row[c]:>13.3f}" for c in cols))
    write_result(args.out, {"config": str(args.config), "changes": changes, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
