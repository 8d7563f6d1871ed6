"""The ideal lower bound on wall time: all GPU-seconds of work spread perfectly over all GPUs.

Where it sits: ``sim.run`` attaches it to every result so a wall time is also
read as a ratio to the physical limit. Work counted, per trained sample:

- rollout: its decoded tokens at the replica's *peak* decode throughput (full
  engine batch, the fastest replica kind), times GPUs per replica;
- training: its tokens at one trainer unit's cost (no data-parallel loss),
  times the unit's GPUs, plus the fixed per-micro-step overhead on one unit.

Left out on purpose (all are overheads a schedule may or may not pay): weight
sync, sleep/wake, re-prefill after aborts, prefill (it overlaps decode in the
model), idle tails, dropped samples. The bound takes the cheapest samples the
run could have trained, so it does not depend on the schedule and no
simulated run can beat it.
"""

from __future__ import annotations

from sim.model import Workload
from sim.scenario import Scenario


def ideal_lower_bound_s(scenario: Scenario, workload: Workload) -> float:
    cfg = scenario.async_training
    cluster = scenario.cluster
    rep = scenario.replica
    tr = scenario.trainer
    step_required = cfg.ppo_mini_batch_size * cfg.require_batches * cfg.trigger_parameter_sync_step
    num_versions = cfg.total_rollout_steps // step_required
    num_trained = num_versions * step_required
    micro_steps = num_versions * cfg.trigger_parameter_sync_step
    peak_tps = rep.peak_tokens_per_s() * max(1.0, rep.hybrid_speed_factor)
    costs = []
    for k in range(cfg.total_rollout_steps):
        rollout_gpu_s = sum(workload.response[k]) / peak_tps * cluster.gpus_per_replica
        train_gpu_s = workload.sample_tokens(k) / 1000.0 * tr.seconds_per_ktoken * cluster.trainer_unit_gpus
        costs.append(rollout_gpu_s + train_gpu_s)
    costs.sort()
    fixed_gpu_s = micro_steps * tr.fixed_s_per_micro_step * cluster.trainer_unit_gpus
    work_gpu_s = sum(costs[:num_trained]) + fixed_gpu_s
    return work_gpu_s / cluster.total_gpus
