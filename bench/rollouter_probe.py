"""What bounds the rollouter in a planner run: staleness pauses, slots, sample latency (issue gap).

Where it sits: a planner bench over `sim.run.Simulation`, next to `bench.where_time_goes` (which
splits the trainer's cycle). This one watches the rollouter side of the same run: every 0.5
modelled s it samples whether the feed is paused (the staleness or queue limit), how many samples
are generating against `max_concurrent`, and each awake replica's decoding batch; at every
`reset_staleness` it records what is generating and queued; and it measures each sample's latency
(fed to queued). Little's law ties them: mean generating = production rate x mean latency.

Run: ``python -m bench.rollouter_probe [--config FILE] [--policy P] [--split 16:16]
[--set KEY=VALUE ...] [--prompts N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench import parse_sets, write_result
from bench.where_time_goes import add_run_arguments, scenario_for
from shared.names import AccountingField as A
from sim.model import Replica, Request
from sim.run import Simulation

TICK_S = 0.5
"""Sampling period of the probe, modelled seconds."""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def latency_alone_s(sim: Simulation, batch: float) -> float:
    """Mean latency a sample would have with no abort, retry or queueing: its prompt's prefill, then
    its slowest response at one sequence's speed in a replica decoding `batch` requests of like
    contexts (the step's context term at the response's midpoint)."""
    timing, work = sim.scenario.replica, sim.workload
    b = max(1, round(batch))
    total = 0.0
    for prompt, responses in zip(work.prompt, work.response, strict=True):
        slowest = max(responses)
        step_s = timing.step_time_s(b, 1.0, b * (prompt + slowest / 2.0))
        total += prompt / timing.prefill_tokens_per_s + slowest * step_s
    return total / max(1, len(work.prompt))


def probe(sim: Simulation) -> dict[str, Any]:
    """Run `sim` to the end, watching its rollouter; returns the summary."""
    ro, eng, life = sim.rollouter, sim.engine, sim.rollouter.lifecycle
    latencies: list[float] = []
    at_reset: list[tuple[int, int, int]] = []
    ticks: list[tuple[bool, int, int]] = []
    batches: dict[str, list[int]] = {rid: [] for rid in ro.replicas}
    reset, on_finish = ro.reset, ro.on_finish

    def watched_reset(version: int) -> dict[str, float]:
        at_reset.append((len(life.active), len(ro.mq), life.fed))
        return reset(version)

    def watched_finish(replica: Replica, req: Request) -> None:
        on_finish(replica, req)
        if req.sample.pending == 0:
            latencies.append(req.sample.finished_s - req.sample.submitted_s)

    def tick() -> None:
        ticks.append((life.tracker.paused, len(life.active), life.max_concurrent))
        for rid, rep in ro.replicas.items():
            if rep.awake and not rep.paused:
                batches[rid].append(rep._decoding)  # noqa: SLF001 - a probe reads the model's state
        eng.after(TICK_S, tick)

    ro.reset = watched_reset  # type: ignore[method-assign]
    for rep in ro.replicas.values():
        rep.on_finish = watched_finish
    eng.after(TICK_S, tick)
    result = sim.run()
    steady = at_reset[2:] or at_reset
    starts = [b[2] - a[2] for a, b in zip(steady, steady[1:], strict=False)]
    n = max(1, len(ticks))
    mean_generating = sum(t[1] for t in ticks) / n
    rate = result.samples[A.TRAINED] / result.wall_s if result.wall_s else 0.0
    return {
        "wall_h": result.wall_s / 3600.0, "activations": result.activations,
        "latency_mean_s": statistics.fmean(latencies), "latency_p50_s": _quantile(latencies, 0.5),
        "latency_p90_s": _quantile(latencies, 0.9), "latency_p99_s": _quantile(latencies, 0.99),
        "generating_at_reset": statistics.fmean(a[0] for a in steady),
        "queued_at_reset": statistics.fmean(a[1] for a in steady),
        "starts_per_version": statistics.fmean(starts) if starts else 0.0,
        "feed_paused_share": sum(t[0] for t in ticks) / n,
        "slots_full_share": sum(t[1] >= t[2] for t in ticks) / n,
        "mean_generating": mean_generating, "mean_max_concurrent": sum(t[2] for t in ticks) / n,
        "littles_law_latency_s": mean_generating / rate if rate else 0.0,
        "decoding_batch": {rid: statistics.fmean(b) for rid, b in batches.items() if b},
        "latency_alone_s": latency_alone_s(sim, statistics.fmean(
            statistics.fmean(b) for rid, b in batches.items() if b and rid.startswith("standalone"))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_run_arguments(parser)
    parser.add_argument("--policy", default="static", help="static | a policy")
    parser.add_argument("--split", default="16:16", help="TRAIN:ROLLOUT GPUs")
    args = parser.parse_args(argv)
    changes = parse_sets(args.set)
    scenario = scenario_for(args.config, policy=args.policy, split=args.split, prompts=args.prompts,
                            changes=changes)
    summary = probe(Simulation(scenario))
    for key, value in summary.items():
        if isinstance(value, dict):
            shown = ", ".join(f"{k} {v:.1f}" for k, v in value.items())
        else:
            shown = f"{value:.3f}"
        print(f"{key:<24} {shown}")
    write_result(args.out, {"config": str(args.config), "policy": args.policy, "split": args.split,
                            "changes": changes, **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
