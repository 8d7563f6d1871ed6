"""Command line of the simulator: ``simulate`` and ``plan``.

Where it sits: ``add_subcommands(subparsers)`` registers both on the main
``dynsched`` CLI (services/cli.py); ``python -m sim.cli ...`` runs them
standalone. This module only parses arguments, calls ``sim.run`` /
``sim.plan``, prints and writes files.

    simulate --config FILE [--policy NAME] [--split T:R] [--compare T:R,...]
             [--policy-module MOD] [--prompts N] [--out DIR] [--json]
    plan     --config FILE [--policy-module MOD] [--prompts N] [--workers K] [--concurrency 1,2]
             [--hybrid-concurrency 1,0.5] [--seeds N]

FILE is a run config, the same file `dynsched run` takes (configs/*.yaml, or the
planning scenarios in scenarios/*.yaml); ``--scenario`` is an alias of ``--config``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from policies import load_policy_module, registered_policies
from policies.check import check_policy
from shared.config import ConfigError, load_config
from sim.plan import DEFAULT_CONCURRENCY, DEFAULT_HYBRID_CONCURRENCY, format_table, plan, recommend
from sim.result import SimResult
from sim.run import simulate
from sim.scenario import Scenario


def parse_split(text: str) -> tuple[int, int]:
    try:
        train, rollout = (int(part) for part in text.split(":"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"split must look like T:R (e.g. 16:16), got {text!r}") from exc
    return train, rollout


def parse_multiples(text: str) -> tuple[float, ...]:
    error = f"concurrency must be positive numbers like 1,1.5,2, got {text!r}"
    try:
        multiples = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(error) from exc
    if not multiples or any(m <= 0 for m in multiples):
        raise argparse.ArgumentTypeError(error)
    return multiples


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _load(args: argparse.Namespace) -> Scenario:
    """The config as the simulator's view; every mistake is one ConfigError line naming the file."""
    for module in args.policy_module:
        load_policy_module(module)
    config = load_config(args.config)
    check_policy(config, source=args.config)
    policy = getattr(args, "policy", "")
    if policy and policy != "static" and policy not in registered_policies():
        raise ConfigError(f"--policy {policy!r} is not a registered policy: expected static or one of "
                          f"{', '.join(registered_policies())} (user policies need --policy-module)")
    scenario = Scenario.from_config(config)
    if args.prompts:
        scenario = scenario.with_prompts(args.prompts)
    return scenario


def _row(res: SimResult) -> str:
    s = res.summary()
    return (f"{s['label']:<28} {s['wall_h']:>7.3f} {s['ideal_bound_h']:>7.3f} {s['ratio_to_bound']:>7.2f} "
            f"{s['activations']:>6} {s['mean_mq_size']:>7.1f} {s['mean_resource_utilization']:>6.2f} "
            f"{s['gpu_busy_fraction']:>6.2f} {s['runtime_s']:>6.1f}")


HEADER = (f"{'run':<28} {'wall h':>7} {'bound h':>7} {'x bound':>7} {'activ.':>6} {'mean mq':>7} "
          f"{'U_clu':>6} {'busy':>6} {'sim s':>6}")


LEGEND = ("wall h: simulated training time; bound h: the ideal bound (every GPU busy all the time); "
          "x bound: wall / bound;\nactiv.: hybrid activations; mean mq: MessageQueue size after each sync "
          "cycle's last micro-step, averaged (mq_size.png);\n"
          "U_clu: mean dynamic_resource/resource_utilization (seed 4.3); "
          "busy: share of GPU-seconds generating or training; sim s: simulator run time")


def cmd_simulate(args: argparse.Namespace) -> int:
    scenario = _load(args)
    if args.split:
        scenario = scenario.with_split(*args.split, policy=args.policy)
    elif args.policy:
        scenario = scenario.with_policy(args.policy)
    results = [simulate(scenario)]
    for train, rollout in args.compare:
        results.append(simulate(scenario.with_split(train, rollout, policy="static")))
    main = results[0]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        summary = [r.to_dict(with_series=False) for r in results]
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        with (out / "cycles.jsonl").open("w") as fh:
            for res in results:
                for cycle in res.cycles:
                    fh.write(json.dumps({"run": res.label, **cycle}) + "\n")
        from sim.plots import write_plots  # matplotlib only when plotting

        write_plots(results, out)
    if args.json:
        payload: Any = main.to_dict() if not args.compare else [r.to_dict() for r in results]
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"config {scenario.name}: {scenario.async_training.total_rollout_steps} prompts, "
          f"{scenario.cluster.total_gpus} GPUs")
    print(HEADER)
    for res in results:
        print(_row(res))
    print(LEGEND)
    s = main.samples
    print(f"samples: fed {s['fed']} = generating {s['generating']} + queued {s['queued']} "
          f"+ trained {s['trained']} + dropped {s['dropped']}; retried attempts {s['retried_attempts']}; "
          f"switches {main.activations} activations / {main.deactivations} deactivations")
    if args.out:
        print(f"wrote {args.out}/summary.json, cycles.jsonl and PNG charts")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    scenario = _load(args)
    rows = plan(scenario, policy_modules=tuple(args.policy_module), workers=args.workers,
                concurrency=args.concurrency, hybrid_concurrency=args.hybrid_concurrency, seeds=args.seeds)
    best = recommend(rows)
    print(f"config {scenario.name}: {scenario.cluster.total_gpus} GPUs, "
          f"{scenario.async_training.total_rollout_steps} prompts")
    print(format_table(rows, recommended=best))
    kind = "plain fully-async" if best.policy == "static" else f"dynamic scheduling, policy {best.policy!r}"
    print(f"recommended: {best.train_gpus} train + {best.rollout_gpus} rollout GPUs, {kind}, "
          f"concurrent_samples_per_replica {best.concurrency} "
          f"{'' if best.hybrid_concurrency is None else f'(hybrids {best.hybrid_concurrency}) '}"
          f"({best.wall_h:.3f} h{f' on average over {best.seeds} workload draws' if best.seeds > 1 else ''}, "
          f"{best.bound_ratio:.2f}x the ideal bound)")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "--scenario", dest="config", required=True,
                        help="run config YAML, as for `dynsched run` (configs/, scenarios/)")
    parser.add_argument("--policy-module", action="append", default=[],
                        help="import this module first so its @register_policy runs (repeatable)")
    parser.add_argument("--prompts", type=int, default=0, help="override total_rollout_steps (quick looks)")


def add_subcommands(subparsers: Any) -> None:
    """Register ``simulate`` and ``plan`` on an argparse subparsers object."""
    sim = subparsers.add_parser("simulate", help="simulate one configuration on a virtual clock")
    _common(sim)
    sim.add_argument("--policy", default="", help="policy name, or 'static' for plain fully-async")
    sim.add_argument("--split", type=parse_split, default=None, help="train:rollout GPUs, e.g. 16:16")
    sim.add_argument("--compare", type=lambda t: [parse_split(x) for x in t.split(",") if x], default=[],
                     help="also simulate static runs at these splits, e.g. 16:16,8:24")
    sim.add_argument("--out", default="", help="directory for summary.json, cycles.jsonl and PNG charts")
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.set_defaults(handler=cmd_simulate)
    pl = subparsers.add_parser("plan", help="rank train/rollout splits x policies by simulated wall time")
    _common(pl)
    pl.add_argument("--workers", type=int, default=None, help="parallel simulations (default: CPU count)")
    pl.add_argument("--concurrency", type=parse_multiples, default=DEFAULT_CONCURRENCY,
                    help="multiples of the config's concurrent_samples_per_replica to try, e.g. 1,1.5,2 "
                         "(default 1,2)")
    pl.add_argument("--hybrid-concurrency", type=parse_multiples, default=DEFAULT_HYBRID_CONCURRENCY,
                    help="multiples of the config's samples in flight per hybrid replica to try in dynamic "
                         "runs, e.g. 1,0.5 (default 1; async_training.hybrid_concurrent_samples_per_replica)")
    pl.add_argument("--seeds", type=positive_int, default=1,
                    help="workload draws per run (run.seed and the next ones), ranked by their mean: a noisy "
                         "workload's gap between two policies on one draw is partly chance (default 1)")
    pl.set_defaults(handler=cmd_plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.cli",
                                     description="dynsched discrete-event simulator")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
