"""Planner: sweep train/rollout splits x policies and rank them by simulated wall time.

Where it sits: ``sim.cli plan``. For each split (train GPUs in steps of the
trainer unit, rollout GPUs in steps of a replica, total fixed by the scenario)
it simulates plain fully-async (``static``) and every registered policy (user
policies included, once their module is loaded), in parallel processes, and
ranks the runs. The recommendation is the fastest run; a dynamic policy is
only recommended over the best static split when it is faster by more than
``min_gain`` (a small modelled gain is not worth a mode switch per step).

Each (split, policy) also runs at every multiple of the config's
``concurrent_samples_per_replica`` given (``--concurrency``, default 1 and 2):
samples in flight per replica beyond the engine's running cap keep its batch
full while a group's short responses finish before its long ones. On the seed
scenario that alone beats every run that switches (docs/scheduling.md, "First,
the samples in flight"), so a static baseline at the configured concurrency
only is not the best static split. What more samples in flight cost in data age the table shows
(`lag v.`, `lag>=2`) rather than weighs: the mean lag of trained samples is set by the staleness limit
whenever the rollouter reaches it each version (which versions samples start and are trained in is then
a matter of counts), so concurrency and policy only move the tail of samples 2+ versions old.

Each dynamic run also runs at every multiple given (``--hybrid-concurrency``, default 1: the config's
own) of the samples in flight per *hybrid* replica (`hybrid_concurrent_samples_per_replica`, which scales
with the run's concurrency).
On an engine whose decode step grows with the batch, fewer samples started on the hybrids hand less
unfinished work to the standalones when the hybrids sleep (docs/scheduling.md, "Samples in flight on the
hybrids"); on a flat one they lose throughput, so the planner measures it per config.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from statistics import fmean

from policies import load_policy_module, registered_policies
from sim.run import simulate
from sim.scenario import Scenario


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    train_gpus: int
    rollout_gpus: int
    policy: str
    concurrency: int
    """`concurrent_samples_per_replica` of the run."""
    hybrid_concurrency: int | None = None
    """`hybrid_concurrent_samples_per_replica` of a dynamic run (None: a static run, or as `concurrency`)."""
    wall_h: float
    bound_ratio: float
    activations: int
    mean_mq_size: float
    trainer_idle_ratio: float = 0.0
    """The trainer's share of its step time spent waiting for samples (`SimResult.trainer_idle_ratio`)."""
    mean_sample_lag: float = 0.0
    """Mean versions a trained sample lags the trainer (`SimResult.mean_sample_lag`)."""
    stale_tail_share: float = 0.0
    """Share of trained samples 2 or more versions behind the trainer."""
    seeds: int = 1
    """Workload draws the row is the mean of (``--seeds``): the config's seed and the next ones."""
    wall_h_spread: float = 0.0
    """Slowest minus fastest of those draws, hours (0 for one draw)."""


def splits(scenario: Scenario) -> list[tuple[int, int]]:
    c = scenario.cluster
    step = max(c.trainer_unit_gpus, c.gpus_per_replica)
    out = []
    for train in range(step, c.total_gpus + 1, step):
        rollout = c.total_gpus - train
        if train % c.gpus_per_replica == 0 and rollout % c.gpus_per_replica == 0:
            out.append((train, rollout))
    return out


def _policies(policy_modules: tuple[str, ...]) -> list[str]:
    for module in policy_modules:
        load_policy_module(module)
    return ["static", *dynamic_policies()]


def dynamic_policies() -> list[str]:
    """Every registered policy but `static_fully_async`, sorted: its runs are the planner's `static` ones."""
    return [name for name in sorted(registered_policies()) if name != "static_fully_async"]


def _scaled(base: float, multiples: tuple[float, ...], what: str) -> list[int]:
    """The distinct whole numbers `base` times each multiple (at least 1), ascending."""
    if not multiples or any(m <= 0 for m in multiples):
        raise ValueError(f"{what} multiples must be positive, got {multiples}")
    return sorted({max(1, round(base * m)) for m in multiples})


def concurrencies(scenario: Scenario, multiples: tuple[float, ...]) -> list[int]:
    """The distinct `concurrent_samples_per_replica` values: the config's times each multiple (at least 1)."""
    return _scaled(scenario.config.async_training.concurrent_samples_per_replica, multiples, "concurrency")


def hybrid_concurrencies(scenario: Scenario, concurrency: int,
                         multiples: tuple[float, ...]) -> list[int | None]:
    """The distinct samples in flight per hybrid replica for a run at `concurrency`: the config's hybrid
    share of it (`hybrid_concurrent_samples_per_replica` / `concurrent_samples_per_replica`, 1 when not
    set) times each multiple, at least 1; None where that equals `concurrency` (hybrids as standalones)."""
    at = scenario.config.async_training
    per_standalone = at.concurrent_samples_per_replica
    share = (at.hybrid_concurrent_samples_per_replica or per_standalone) / per_standalone
    values = _scaled(concurrency * share, multiples, "hybrid concurrency")
    return [None if v == concurrency else v for v in values]


Job = tuple[Scenario, int, int, str, int, int | None, tuple[str, ...], int]
"""(scenario, train GPUs, rollout GPUs, policy, concurrency, hybrid concurrency, policy modules, seed)."""


def _run_one(job: Job) -> PlanRow:
    scenario, train, rollout, policy, concurrency, hybrid_concurrency, modules, seed = job
    for module in modules:  # worker processes need the user's registrations too
        load_policy_module(module)
    run = scenario.with_seed(seed).with_changes(
        {"async_training.concurrent_samples_per_replica": concurrency,
         "async_training.hybrid_concurrent_samples_per_replica": hybrid_concurrency})
    res = simulate(run.with_split(train, rollout, policy=policy))
    return PlanRow(train_gpus=train, rollout_gpus=rollout, policy=policy, concurrency=concurrency,
                   hybrid_concurrency=hybrid_concurrency, wall_h=res.wall_s / 3600.0,
                   bound_ratio=res.bound_ratio, activations=res.activations,
                   mean_mq_size=res.mean_mq_size(), trainer_idle_ratio=res.trainer_idle_ratio(),
                   mean_sample_lag=res.mean_sample_lag(),
                   stale_tail_share=res.stale_tail_share(versions=2))


DEFAULT_CONCURRENCY = (1.0, 2.0)
"""Multiples of the config's `concurrent_samples_per_replica` the planner tries by default."""
DEFAULT_HYBRID_CONCURRENCY = (1.0,)
"""Multiples of a run's concurrency tried for the hybrid replicas by default (1: as a standalone)."""


def plan(scenario: Scenario, *, policy_modules: tuple[str, ...] = (), workers: int | None = None,
         policies: tuple[str, ...] = (), concurrency: tuple[float, ...] = DEFAULT_CONCURRENCY,
         hybrid_concurrency: tuple[float, ...] = DEFAULT_HYBRID_CONCURRENCY, seeds: int = 1) -> list[PlanRow]:
    """Every (split, policy, concurrency) run, fastest first; `policies` (default: static and every
    registered one) narrows the sweep, `concurrency` gives the multiples of the config's samples in
    flight per replica, `hybrid_concurrency` those of each run's for the hybrids (dynamic runs). Splits
    with no rollout GPUs only run dynamic policies. With `seeds` > 1 each run is simulated on that many
    workload draws (the config's seed and the next ones, the same draws for every run) and ranked by their
    mean: a version bound by its slowest sample makes one draw's gap between two policies partly chance."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    jobs: list[Job] = []
    for train, rollout in splits(scenario):
        for policy in policies or _policies(policy_modules):
            if rollout == 0 and policy == "static":
                continue
            for samples in concurrencies(scenario, concurrency):
                hybrid: list[int | None] = [None]
                if policy != "static":
                    hybrid = hybrid_concurrencies(scenario, samples, hybrid_concurrency)
                jobs += [(scenario, train, rollout, policy, samples, hybrid_samples, policy_modules,
                          scenario.seed + i) for hybrid_samples in hybrid for i in range(seeds)]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        draws = [_run_one(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            draws = list(pool.map(_run_one, jobs))
    rows = [_mean_row(draws[i:i + seeds]) for i in range(0, len(draws), seeds)]
    return sorted(rows, key=lambda r: r.wall_h)


def _mean_row(draws: list[PlanRow]) -> PlanRow:
    """One run's draws (same split, policy and both concurrencies) as their mean, with the wall time's
    spread."""
    def mean(name: str) -> float:
        return fmean(getattr(d, name) for d in draws)

    walls = [d.wall_h for d in draws]
    return dataclasses.replace(
        draws[0], wall_h=mean("wall_h"), bound_ratio=mean("bound_ratio"),
        activations=round(mean("activations")), mean_mq_size=mean("mean_mq_size"),
        trainer_idle_ratio=mean("trainer_idle_ratio"),
        mean_sample_lag=mean("mean_sample_lag"), stale_tail_share=mean("stale_tail_share"),
        seeds=len(draws), wall_h_spread=max(walls) - min(walls))


def recommend(rows: list[PlanRow], *, min_gain: float = 0.02) -> PlanRow:
    best = rows[0]
    static = [r for r in rows if r.policy == "static"]
    if best.policy != "static" and static and best.wall_h > static[0].wall_h * (1 - min_gain):
        return static[0]
    return best


def format_table(rows: list[PlanRow], *, recommended: PlanRow) -> str:
    spread = any(r.seeds > 1 for r in rows)
    lines = [f"{'rank':>4}  {'split T:R':>9}  {'policy':<20} {'conc.':>5} {'hyb.':>4} {'wall h':>7} "
             + (f"{'spread':>7} " if spread else "")
             + f"{'x bound':>7} {'activ.':>6} {'mean mq':>7} {'idle':>6} {'lag v.':>6} {'lag>=2':>6}"]
    for i, r in enumerate(rows, 1):
        mark = "  <- recommended" if r == recommended else ""
        hybrid = "-" if r.hybrid_concurrency is None else str(r.hybrid_concurrency)
        lines.append(f"{i:>4}  {r.train_gpus:>4}:{r.rollout_gpus:<4}  {r.policy:<20} {r.concurrency:>5} "
                     f"{hybrid:>4} "
                     f"{r.wall_h:>7.3f} " + (f"{r.wall_h_spread:>7.3f} " if spread else "")
                     + f"{r.bound_ratio:>7.2f} {r.activations:>6} {r.mean_mq_size:>7.1f} "
                     f"{100 * r.trainer_idle_ratio:>5.1f}% "
                     f"{r.mean_sample_lag:>6.2f} {100 * r.stale_tail_share:>5.1f}%{mark}")
    legend = PLAN_LEGEND + (f"; wall h: the mean over {rows[0].seeds} workload draws, spread: their slowest "
                            "minus their fastest" if spread else "")
    return "\n".join([*lines, legend])


PLAN_LEGEND = ("conc.: async_training.concurrent_samples_per_replica (samples in flight per replica); "
               "hyb.: async_training.hybrid_concurrent_samples_per_replica (- = as conc.); "
               "wall h: simulated training time;\nx bound: wall time / the ideal bound (every GPU busy "
               "all the time, 1.00 = unbeatable);\nactiv.: hybrid activations; mean mq: MessageQueue size "
               "after each sync cycle's last micro-step, averaged over cycles (mq_size.png);\n"
               "idle: the trainer's share of its step time spent waiting for samples "
               "(fully_async/trainer/idle_ratio over the run): a static run that idles little leaves "
               "lending its GPUs little to recover;\nlag v.: "
               "versions a trained sample lags the trainer (its first tokens' weights), mean; lag>=2: share "
               "of trained samples 2+ versions behind.\nThe mean lag is set by staleness_threshold whenever "
               "the rollouter reaches its limit each version; the samples in flight move only the tail")
