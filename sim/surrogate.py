"""The trainer side of the per-step observables in closed form (the consumption-bound limit).

Where it sits: ``sim.calibrate`` takes the Jacobian of trainer-side parameters (MFU, non-scaling
part, batch collection, response growth) from this instead of from extra full simulations, which
for a 400-step, 800,000-trajectory run cost a minute each. The residuals themselves always come
from full simulations: a wrong slope costs an iteration (the step is rejected), never accuracy.

Per trainer step ``k`` with ``tokens_k`` trained tokens (the workload's samples in feed order):
``update_k = fixed + tokens_k * cost / speedup``, ``gen_k = collect``, ``step_k = gen_k + update_k``,
hours after N steps = the sum of the first N step times. Production waits, syncs and the queue
do not appear: they are what the simulation adds, and they cancel in a finite difference.
"""

from __future__ import annotations

import numpy as np

from sim.model import Workload
from sim.observe import Observed
from sim.scenario import Scenario

SURROGATE_PARAMETERS = frozenset({"train_mfu", "train_non_scaling_s", "collect_s", "response_median_end"})


def sample_tokens_per_step(scenario: Scenario) -> np.ndarray:
    """Trained tokens of each sample (columns) of every trainer step (rows), in feed order."""
    cfg = scenario.async_training
    required = cfg.ppo_mini_batch_size * cfg.require_batches
    work = Workload(scenario.workload, num_samples=cfg.total_rollout_steps, n=cfg.n, seed=scenario.seed)
    per_sample = np.array(work.prompt, dtype=float) * cfg.n + np.array(work.response, dtype=float).sum(axis=1)
    steps = len(per_sample) // required
    return per_sample[: steps * required].reshape(steps, required)


def observe(scenario: Scenario, *, label: str, mq_size: float | None,
            step_unit: str = "micro_step") -> Observed:
    """What a consumption-bound run of ``scenario`` (already at the row's split and length) reports,
    per trainer step or (``step_unit`` 'version') per weight version; validations add wall time."""
    per_sample = sample_tokens_per_step(scenario)
    tokens = per_sample.sum(axis=1)
    cluster, tr = scenario.cluster, scenario.trainer
    update = np.array([tr.micro_step_s(row.tolist()) for row in per_sample])
    step = tr.collect_s + update
    gen = np.full(len(step), tr.collect_s)
    trigger = scenario.async_training.trigger_parameter_sync_step
    versions = len(step) // trigger
    sync = scenario.costs.standalone_sync_s  # the trainer waits for the weight sync inside its last step
    step[trigger - 1 :: trigger] += sync
    per_version = step[: versions * trigger].reshape(versions, trigger).sum(axis=1)
    wall = np.cumsum(per_version)
    if tr.validation_every_versions:
        done = np.arange(1, versions + 1)
        wall = wall + tr.validation_s * ((done - 1) // tr.validation_every_versions
                                         + (1 if tr.validation_before_train else 0))
    if step_unit == "version":
        k = trigger
        hours = {v + 1: float(wall[v]) / 3600.0 for v in range(versions)}
    else:
        k = 1
        hours = {(v + 1) * trigger: float(wall[v]) / 3600.0 for v in range(versions)}
    return Observed(label=label, train_gpus=cluster.train_gpus, rollout_gpus=cluster.rollout_gpus,
                    step_s=k * float(step.mean()), gen_s=k * float(gen.mean()),
                    update_s=k * float(update.mean()), tokens_per_step=k * float(tokens.mean()),
                    mq_size=mq_size, hours=hours)
