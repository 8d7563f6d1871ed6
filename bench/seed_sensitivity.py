"""How far each prior the seed's data cannot pin moves the dynamic prediction and the dynamic gain
(docs/simulator.md table).

Where it sits: the seed scenario is fitted (``sim.calibrate``) on its two static runs only; the
dynamic 16-16 run (5.4 h measured) is a prediction. For each variant below this changes one prior,
refits on the static runs where the prior touches them (a refusal by the physics check is a result:
the data and the prior cannot both hold), then simulates the dynamic run. Reported per variant: the
fitted decode efficiency and training MFU, the predicted dynamic hours (the seed's `default` policy),
its change from the shipped scenario, the ideal bound; and the verdict a user acts on (issue 11):
plain fully-async at every split, `adaptive` with the fast switch mechanics (bench.policy_sweep's
"fast") at every split with hybrids, and the best adaptive split against the best static split; once
at the config's own samples in flight per replica and once with them searched as `dynsched plan` does
(1x and 2x, the dynamic runs also with half of a run's samples on each hybrid), since more samples in
flight can beat switching (docs/scheduling.md, "First, the samples in flight").

Run: ``python -m bench.seed_sensitivity [--workers 2] [--only LABEL] [--out runs/seed_sensitivity.json]``
(each refit is ~10-20 full simulations: minutes per variant).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench import write_result
from bench.policy_sweep import MECHANICS
from sim.calibrate import CalibrationError, calibrate, row_scenario
from sim.physics import PhysicsError
from sim.plan import PlanRow, plan
from sim.run import simulate
from sim.scenario import Scenario, load_scenario

SEED = Path(__file__).resolve().parent.parent / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml"
W = "simulator.workload."
P = "simulator.physics."
VARIANTS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("as shipped", {}, False),
    ("rebalance off", {"async_training.dynamic_schedule_enable_rebalance": False}, False),
    ("initial ratio 0.3", {"async_training.dynamic_schedule_deactivate_ratio": 0.3}, False),
    ("hybrid switch costs halved", {"rollout.sim.wake_s": 1.0, "rollout.sim.sleep_s": 1.5}, False),
    ("hybrid switch costs zero (wake, sleep)", {"rollout.sim.wake_s": 0.0, "rollout.sim.sleep_s": 0.0},
     False),
    ("hybrid decode at 0.7x (gmu 0.45 KV)", {"simulator.hybrid_speed_factor": 0.7}, False),
    ("responses 0.6x shorter", {W + "response_tokens_median_start": 300.0,
                                W + "response_tokens_median_end": 480.0}, True),
    ("trainer non-scaling 0 s", {P + "train_non_scaling_s": 0.0}, True),
    ("no MTP (1 token/step)", {P + "decode_tokens_per_step": 1.0}, True),
)
MORE_VARIANTS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("responses 1.25x longer", {W + "response_tokens_median_start": 625.0,
                                W + "response_tokens_median_end": 1000.0}, True),
    ("response sigma 0.7 (shorter tail)", {W + "response_tokens_sigma": 0.7}, True),
    ("max-length share 0.5%", {W + "max_length_share": 0.005}, True),
    ("trainer non-scaling 2.5 s", {P + "train_non_scaling_s": 2.5}, True),
    ("trainer non-scaling 3.5 s", {P + "train_non_scaling_s": 3.5}, True),
    ("trainer non-scaling 8 s", {P + "train_non_scaling_s": 8.0}, True),
    ("decode overhead 2 ms", {P + "decode_overhead_s": 0.002}, True),
)
"""Refits not run by default (each costs minutes on a shared 2-core machine): ``--more``."""


def dynamic_row(scenario: Scenario) -> Scenario:
    row = next(r for r in scenario.config.simulator.published if not r.fit)
    return row_scenario(scenario, row, max(row.hours))


def run_variant(variant: tuple[str, dict[str, Any], bool]) -> dict[str, Any]:
    label, changes, refit = variant
    scenario = load_scenario(SEED).with_changes(changes) if changes else load_scenario(SEED)
    out: dict[str, Any] = {"variant": label, "refit": refit}
    if refit:
        try:
            scenario, _, _ = calibrate(scenario, steps=1872, log=False)
        except (CalibrationError, PhysicsError) as exc:
            return {**out, "refused": str(exc)}
    phys = scenario.config.simulator.physics
    assert phys is not None
    res = simulate(dynamic_row(scenario))
    return {**out, "decode_efficiency": phys.decode_efficiency, "train_mfu": phys.train_mfu,
            "dynamic_h": res.wall_s / 3600.0, "bound_h": res.ideal_bound_s / 3600.0,
            "activations": res.activations, **gain_vs_best_static(scenario)}


SEARCHED_CONCURRENCY = (1.0, 2.0)
"""Multiples of the config's samples in flight per replica in the searched verdict (the planner's default)."""
SEARCHED_HYBRID_CONCURRENCY = (1.0, 0.5)
"""Multiples of a dynamic run's samples in flight given to each hybrid in the searched verdict."""


def gain_vs_best_static(scenario: Scenario, *, policy: str = "adaptive") -> dict[str, Any]:
    """The planner's sweep of plain fully-async and `policy` with the fast mechanics over every split,
    twice judged: at the config's own samples in flight (the top level: split -> hours) and with them
    searched (`searched`: every split at 1x and 2x the config's concurrency, the dynamic runs also at half
    of it on the hybrids; run label -> hours). Each gives the best static run, the best `policy` run, and
    the second's time against the first's. One plan serves both: the own-concurrency runs are among the
    searched ones."""
    rows = plan(scenario.with_changes(MECHANICS["fast"]), policies=("static", policy), workers=1,
                concurrency=SEARCHED_CONCURRENCY, hybrid_concurrency=SEARCHED_HYBRID_CONCURRENCY)
    at = scenario.config.async_training  # a run's hybrid count is None where it equals the standalones'
    own, own_hybrid = at.concurrent_samples_per_replica, at.hybrid_concurrent_samples_per_replica
    at_own = [r for r in rows if r.concurrency == own and r.hybrid_concurrency in (None, own_hybrid)]
    return {**_verdict(at_own, policy, _split_label), "searched": _verdict(rows, policy, _run_label)}


def _split_label(row: PlanRow) -> str:
    return f"{row.train_gpus}:{row.rollout_gpus}"


def _run_label(row: PlanRow) -> str:
    """Split, samples in flight per replica, and per hybrid where they differ: `16:16 x32/16`."""
    hybrid = "" if row.hybrid_concurrency is None else f"/{row.hybrid_concurrency}"
    return f"{_split_label(row)} x{row.concurrency}{hybrid}"


def _verdict(rows: list[PlanRow], policy: str, label: Callable[[PlanRow], str]) -> dict[str, Any]:
    static_h = {label(r): r.wall_h for r in rows if r.policy == "static"}
    dynamic_h = {label(r): r.wall_h for r in rows if r.policy == policy}
    best_static = min(static_h, key=static_h.__getitem__)
    best_dynamic = min(dynamic_h, key=dynamic_h.__getitem__)
    return {"static_h": static_h, f"{policy}_h": dynamic_h, "best_static": best_static,
            "best_dynamic": best_dynamic,
            "gain_vs_best_static": dynamic_h[best_dynamic] / static_h[best_static] - 1.0}


def format_gain_table(rows: list[dict[str, Any]]) -> str:
    """The verdict per variant at the config's concurrency, then with the concurrency searched."""
    lines = ["| variant | refit | best static | adaptive at 16:16 | best adaptive | vs best static "
             "| searched: best static | best adaptive | vs best static |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['variant']} | yes | refused | | | | | | |")
            continue
        static, dynamic = r["static_h"], r["adaptive_h"]
        best_static, best_dynamic = r["best_static"], r["best_dynamic"]
        searched = r["searched"]
        s_static, s_dynamic = searched["best_static"], searched["best_dynamic"]
        lines.append(f"| {r['variant']} | {'yes' if r['refit'] else 'no'} | "
                     f"{best_static} {static[best_static]:.3f} h | {dynamic.get('16:16', 0.0):.3f} h | "
                     f"{best_dynamic} {dynamic[best_dynamic]:.3f} h | {r['gain_vs_best_static']:+.1%} | "
                     f"{s_static} {searched['static_h'][s_static]:.3f} h | "
                     f"{s_dynamic} {searched['adaptive_h'][s_dynamic]:.3f} h | "
                     f"{searched['gain_vs_best_static']:+.1%} |")
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    base = next((r["dynamic_h"] for r in rows if r["variant"] == "as shipped" and "dynamic_h" in r), None)
    lines = ["| variant (default policy, 16 + 16) | refit | decode eff. | train MFU | predicted | vs shipped "
             "| ideal bound |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['variant']} | yes | refused: {r['refused']} | | | | |")
            continue
        delta = f"{(r['dynamic_h'] / base - 1):+.1%}" if base else ""
        lines.append(f"| {r['variant']} | {'yes' if r['refit'] else 'no'} | {r['decode_efficiency']:.3f} | "
                     f"{r['train_mfu']:.3f} | {r['dynamic_h']:.3f} h | {delta} | {r['bound_h']:.2f} h |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], help="variant labels to run (repeatable)")
    parser.add_argument("--more", action="store_true", help="also the refits in MORE_VARIANTS")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    pool_of = VARIANTS + (MORE_VARIANTS if args.more else ())
    variants = [v for v in pool_of if not args.only or v[0] in args.only or v[0] == "as shipped"]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(run_variant, variants))
    print(format_table(rows))
    print()
    print(format_gain_table(rows))
    write_result(args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
