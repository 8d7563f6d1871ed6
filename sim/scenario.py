"""The simulator's view of one run config: what the timing models read, derived from `shared.config`.

Where it sits: ``sim.cli`` loads a config with ``shared.config.load_config`` (the
same loader, names, defaults and errors as ``dynsched run``), wraps it in a
``Scenario``, optionally overrides the policy or the train/rollout split, and
hands it to ``sim.run.simulate``. Nothing here parses YAML; every override goes
back through the config's validation (``Scenario.with_*``).

How the run sections map onto the simulator (docs/simulator.md has the table):

- cluster: ``trainer.num_gpus`` train GPUs, ``rollout.nnodes x n_gpus_per_node``
  rollout GPUs, ``rollout.tensor_model_parallel_size`` GPUs per replica;
- replica: the sim engine's ``rollout.sim`` (decode step, batch slowdown,
  prefill), ``rollout.max_num_seqs`` running requests, ``rollout.retry_delay_s``;
- costs: a standalone sync is ``rollout.sim.weight_sync_s``; activating a hybrid
  costs ``trainer.offload_s + wake_s + weight_sync_s``, deactivating it
  ``sleep_s``, then the trainer's onload ``trainer.offload_s`` (at once with
  ``dynamic_schedule_overlap_sleep``);
- trainer: ``trainer.time_per_sample_s`` per sample on one GPU, plus the token
  model of ``simulator.trainer``;
- workload: ``simulator.workload`` (log-normal) if given, else the sim engine's
  normal response lengths (``rollout.sim.response_length``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.build import STATIC_POLICY, policy_name
from core.flow import FlowLimits
from shared.config import (
    ROLLOUTER_MONITOR_INTERVAL_S,
    Config,
    Count,
    SimWorkloadConfig,
    load_config,
    replace_config,
)
from sim.physics import decode_timing, trainer_s_per_ktoken, validation_s


@dataclass(frozen=True, kw_only=True)
class ClusterShape:
    train_gpus: int
    """GPUs of the trainer; with dynamic scheduling they also host the hybrid replicas."""
    rollout_gpus: int
    """GPUs of the standalone rollout pool."""
    gpus_per_replica: int
    trainer_unit_gpus: int

    @property
    def total_gpus(self) -> int:
        return self.train_gpus + self.rollout_gpus

    @property
    def num_hybrid(self) -> int:
        return self.train_gpus // self.gpus_per_replica

    @property
    def num_standalone(self) -> int:
        return self.rollout_gpus // self.gpus_per_replica


@dataclass(frozen=True, kw_only=True)
class FlowSettings:
    """The original's ``async_training`` + the batch shape the schedule depends on."""

    ppo_mini_batch_size: int
    trigger_parameter_sync_step: int
    staleness_threshold: float
    total_rollout_steps: int
    n: int
    require_batches: int
    partial_rollout: bool
    concurrent_samples_per_replica: int
    hybrid_concurrent_samples_per_replica: int | None
    use_dynamic_resource_scheduling: bool
    dynamic_schedule_policy: str
    dynamic_schedule_deactivate_ratio: float
    dynamic_schedule_enable_rebalance: bool
    dynamic_schedule_fold_hybrid_sync: bool = False
    dynamic_schedule_overlap_wake: bool = False
    dynamic_schedule_overlap_sleep: bool = False

    @property
    def step_required(self) -> int:
        return self.ppo_mini_batch_size * self.require_batches * self.trigger_parameter_sync_step


class WorkloadShape(SimWorkloadConfig):
    """Token lengths per sample: log-normal with a median drifting over the run (the fields of
    ``simulator.workload``, validated as there), or the sim engine's normal(mean, std) growing by
    ``drift_per_version`` per weight version (``rollout.sim.response_length`` in those fields:
    mean as the median, std as the sigma)."""

    kind: Literal["lognormal", "normal"]
    """'lognormal' (``simulator.workload``) or 'normal' (``rollout.sim.response_length``)."""
    response_tokens_min: Count = 1
    drift_per_version: float = 0.0
    samples_per_version: Count = 1


@dataclass(frozen=True, kw_only=True)
class ReplicaTiming:
    """One inference replica: ``step(b, C) = decode_step_s + max(weights_s, b * decode_step_s /
    batch_half_requests) + C * context_token_s`` for ``b`` running requests holding ``C`` context tokens
    (without ``simulator.physics``: the sim engine's linear model, no weight or context term)."""

    decode_step_s: float
    """Batch-independent part of a step (``rollout.sim.decode_s_per_step``, or the physics overhead)."""
    batch_half_requests: float
    """Running batch at which the batch term equals decode_step_s (1 / ``rollout.sim.batch_slowdown``)."""
    max_running_requests: int
    prefill_tokens_per_s: float
    hybrid_speed_factor: float = 1.0
    retry_delay_s: float = 1.0
    """Client back-off after an aborted attempt (``rollout.retry_delay_s``)."""
    weights_s: float = 0.0
    """Weight read per step (a floor under the batch term: the matmuls' roofline)."""
    context_token_s: float = 0.0
    """Per context token held by a running request (KV-cache read)."""
    kv_capacity_tokens: float = math.inf
    """Context tokens the replica's KV cache holds; beyond it the newest request is preempted."""

    def base_step_s(self, running: int) -> float:
        """The step time without the context term."""
        if self.weights_s == 0.0:
            return self.decode_step_s * (1.0 + running / self.batch_half_requests)
        batch_s = self.decode_step_s * running / self.batch_half_requests
        return self.decode_step_s + max(self.weights_s, batch_s)

    def step_time_s(self, running: int, speed_factor: float = 1.0, context_tokens: float = 0.0) -> float:
        return (self.base_step_s(running) + self.context_token_s * context_tokens) / speed_factor

    def peak_tokens_per_s(self) -> float:
        """Decode throughput at the engine cap, context free (an upper bound: it grows with the batch)."""
        return self.max_running_requests / self.step_time_s(self.max_running_requests)


@dataclass(frozen=True, kw_only=True)
class TrainerTiming:
    """Micro-step time = fixed + tokens * cost / speedup(train units); the planner (``sim.run``) and the
    live sim trainer (``services/trainer/sim_backend.py``) both time the trainer with it."""

    seconds_per_ktoken: float
    fixed_s_per_micro_step: float
    """Includes ``trainer.time_per_sample_s`` x samples per micro-step / ``trainer.num_gpus``."""
    scaling_efficiency: float
    train_units: int = 1
    """``trainer.num_gpus // simulator.trainer_unit_gpus``: what the scaling part is spread over."""
    collect_s: float = 0.0
    """Taking and assembling a micro-step's batch once its samples are queued (inside timing_s/gen):
    ``simulator.trainer.collect_s_per_sample`` x samples."""
    validation_s: float = 0.0
    """One validation, blocking the trainer after a sync (outside timing_s/step)."""
    validation_every_versions: int = 0
    """0: no validation."""
    validation_before_train: bool = False

    def speedup(self, units: int) -> float:
        return units * self.scaling_efficiency ** math.log2(units) if units > 1 else 1.0

    def micro_step_s(self, sample_tokens: Iterable[float]) -> float:
        """Modelled seconds of one micro-step over samples with these trained token counts (each:
        its prompt once per trajectory + its responses, ``sim.model.Workload.sample_tokens``)."""
        tokens = sum(sample_tokens)
        return self.fixed_s_per_micro_step + tokens / 1000.0 * self.seconds_per_ktoken / self.speedup(
            self.train_units)

    @property
    def validation_before_train_s(self) -> float:
        """The validation before training (verl ``val_before_train``); 0 without one."""
        return self.validation_s if self.validation_every_versions and self.validation_before_train else 0.0

    def validation_after_s(self, *, global_steps: int, version: int,
                           trigger_parameter_sync_step: int) -> float:
        """The validation after micro-step ``global_steps`` (now at ``version``), once its metrics are
        reported (verl validates after the step timer of every ``test_freq``-th version); 0 if none."""
        every = self.validation_every_versions
        due = every and global_steps % trigger_parameter_sync_step == 0 and version % every == 0
        return self.validation_s if due else 0.0


@dataclass(frozen=True, kw_only=True)
class SwitchCosts:
    """Fixed costs of weight sync and mode switches, in modelled seconds."""

    standalone_sync_s: float
    hybrid_sync_s: float
    hybrid_sleep_s: float
    """A hybrid's sleep alone; the trainer's onload after it is `trainer_offload_s` again."""
    monitor_interval_s: float
    trainer_offload_s: float = 0.0
    """The trainer's offload before hybrids wake (part of hybrid_sync_s, modelled on its own), and its
    onload once they slept (after GPUS_READY, or with the sleep under dynamic_schedule_overlap_sleep)."""
    hybrid_wake_s: float = 0.0
    """A hybrid's wake (part of hybrid_sync_s); the rest of hybrid_sync_s is its weight sync."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One config as the simulator sees it; build with ``Scenario.from_config``."""

    config: Config
    name: str
    seed: int
    cluster: ClusterShape
    async_training: FlowSettings
    workload: WorkloadShape
    replica: ReplicaTiming
    trainer: TrainerTiming
    costs: SwitchCosts

    @classmethod
    def from_config(cls, config: Config) -> Scenario:
        at, sim = config.async_training, config.simulator
        policy = policy_name(at)  # as the controller is built (core.build): static_fully_async if not dynamic
        flow = FlowSettings(ppo_mini_batch_size=config.trainer.ppo_mini_batch_size,
                            total_rollout_steps=config.data.total_rollout_steps, n=config.data.n,
                            dynamic_schedule_policy=policy,
                            **{key: getattr(at, key) for key in _FLOW_FROM_ASYNC})
        return cls(config=config, name=config.run.name, seed=config.run.seed, async_training=flow,
                   cluster=ClusterShape(train_gpus=config.trainer.num_gpus,
                                        rollout_gpus=config.rollout.num_standalone_gpus,
                                        gpus_per_replica=config.rollout.tensor_model_parallel_size,
                                        trainer_unit_gpus=sim.trainer_unit_gpus),
                   workload=_workload(config, flow.step_required), replica=_replica(config),
                   trainer=trainer_timing(config),
                   costs=_costs(config))

    def with_changes(self, changes: dict[str, Any]) -> Scenario:
        """Re-validated copy with dotted config keys changed, e.g. {"rollout.sim.decode_s_per_step": 0.01}."""
        return Scenario.from_config(replace_config(self.config, changes))

    def with_split(self, train_gpus: int, rollout_gpus: int, *, policy: str = "") -> Scenario:
        """Another train/rollout split (and policy, if given: both change in one validated step)."""
        per_node = self.config.rollout.n_gpus_per_node
        if rollout_gpus % per_node == 0:
            nnodes = rollout_gpus // per_node
        else:
            nnodes, per_node = 1, rollout_gpus
        changes = {"trainer.num_gpus": train_gpus, "rollout.nnodes": nnodes,
                   "rollout.n_gpus_per_node": per_node}
        return self.with_changes({**changes, **(_policy_changes(policy) if policy else {})})

    def with_policy(self, policy: str) -> Scenario:
        """Dynamic scheduling with ``policy``; ``static`` means plain fully-async (hybrids never used)."""
        return self.with_changes(_policy_changes(policy))

    def with_prompts(self, total_rollout_steps: int) -> Scenario:
        return self.with_changes({"data.total_rollout_steps": total_rollout_steps})

    def with_seed(self, seed: int) -> Scenario:
        return self.with_changes({"run.seed": seed})


def _policy_changes(policy: str) -> dict[str, Any]:
    dynamic = policy != "static"
    return {"async_training.dynamic_schedule_policy": policy if dynamic else STATIC_POLICY,
            "async_training.use_dynamic_resource_scheduling": dynamic}


_FLOW_FROM_ASYNC = ("trigger_parameter_sync_step", "staleness_threshold", "require_batches",
                    "partial_rollout", "concurrent_samples_per_replica",
                    "hybrid_concurrent_samples_per_replica", "use_dynamic_resource_scheduling",
                    "dynamic_schedule_deactivate_ratio", "dynamic_schedule_enable_rebalance",
                    "dynamic_schedule_fold_hybrid_sync", "dynamic_schedule_overlap_wake",
                    "dynamic_schedule_overlap_sleep")


def _workload(config: Config, samples_per_version: int) -> WorkloadShape:
    w = config.simulator.workload
    if w is not None:  # a response stops at the engines' max_tokens, data.max_response_length, as live
        longest = min(w.response_tokens_max, config.data.max_response_length)
        return WorkloadShape(kind="lognormal", **{**w.model_dump(), "response_tokens_max": longest})
    lengths = config.rollout.sim.response_length
    return WorkloadShape(kind="normal", prompt_tokens_median=config.data.prompt_length,
                         prompt_tokens_sigma=0.0, prompt_tokens_max=config.data.prompt_length,
                         response_tokens_median_start=lengths.mean,
                         response_tokens_median_end=lengths.mean, response_tokens_sigma=lengths.std,
                         response_tokens_max=config.data.max_response_length,
                         response_tokens_min=lengths.min_tokens, drift_per_version=lengths.drift_per_version,
                         samples_per_version=samples_per_version)


def _replica(config: Config) -> ReplicaTiming:
    engine = config.rollout.sim
    base = ReplicaTiming(
        decode_step_s=engine.decode_s_per_step,
        batch_half_requests=1.0 / engine.batch_slowdown if engine.batch_slowdown > 0 else math.inf,
        max_running_requests=config.rollout.max_num_seqs,
        prefill_tokens_per_s=1.0 / engine.prefill_s_per_token if engine.prefill_s_per_token > 0 else math.inf,
        hybrid_speed_factor=config.simulator.hybrid_speed_factor, retry_delay_s=config.rollout.retry_delay_s)
    phys = config.simulator.physics
    if phys is None:
        return base
    d = decode_timing(phys, config.rollout.tensor_model_parallel_size)
    return dataclasses.replace(base, decode_step_s=d.overhead_s,
                               batch_half_requests=d.overhead_s / d.per_request_s,
                               prefill_tokens_per_s=d.prefill_tokens_per_s, weights_s=d.weights_s,
                               context_token_s=d.per_context_token_s, kv_capacity_tokens=d.kv_capacity_tokens)


def trainer_timing(config: Config) -> TrainerTiming:
    """The trainer's timing, exactly as the planner derives it from ``config``: what the live sim
    trainer (``services/trainer/sim_backend.py``) runs, so both time a batch alike."""
    samples_per_micro_step = config.trainer.ppo_mini_batch_size * config.async_training.require_batches
    token_model = config.simulator.trainer
    per_sample_s = samples_per_micro_step * config.trainer.time_per_sample_s / config.trainer.num_gpus
    units = config.trainer.num_gpus // config.simulator.trainer_unit_gpus
    phys = config.simulator.physics
    if phys is not None:  # the scaling part from the MFU, all of the rest in the fitted non-scaling part
        unit_gpus = config.simulator.trainer_unit_gpus
        val = phys.validation
        mini_batches = max(1, samples_per_micro_step // config.trainer.ppo_mini_batch_size)  # optimizer steps
        return TrainerTiming(seconds_per_ktoken=trainer_s_per_ktoken(phys, unit_gpus),
                             fixed_s_per_micro_step=phys.train_non_scaling_s * mini_batches + per_sample_s,
                             scaling_efficiency=1.0, train_units=units,
                             collect_s=token_model.collect_s_per_sample * samples_per_micro_step,
                             validation_s=validation_s(phys, config.rollout.tensor_model_parallel_size),
                             validation_every_versions=val.every_versions if val else 0,
                             validation_before_train=val.before_train if val else False)
    return TrainerTiming(seconds_per_ktoken=token_model.seconds_per_ktoken,
                         fixed_s_per_micro_step=token_model.fixed_s_per_micro_step + per_sample_s,
                         scaling_efficiency=token_model.scaling_efficiency, train_units=units,
                         collect_s=token_model.collect_s_per_sample * samples_per_micro_step)


def _costs(config: Config) -> SwitchCosts:
    engine, offload_s = config.rollout.sim, config.trainer.offload_s
    monitor_s = config.simulator.monitor_interval_s
    return SwitchCosts(standalone_sync_s=engine.weight_sync_s,
                       hybrid_sync_s=offload_s + engine.wake_s + engine.weight_sync_s,
                       hybrid_sleep_s=engine.sleep_s,
                       monitor_interval_s=monitor_s or ROLLOUTER_MONITOR_INTERVAL_S / config.run.time_scale,
                       trainer_offload_s=offload_s, hybrid_wake_s=engine.wake_s)


def load_scenario(path: str | Path) -> Scenario:
    """Load a run config (configs/*.yaml, scenarios/*.yaml) as the simulator's view."""
    return Scenario.from_config(load_config(path))


def engine_model(config: Config) -> tuple[ReplicaTiming, WorkloadShape]:
    """One replica's timing and the run's token lengths, exactly as the planner derives them from
    ``config``: what the live sim engine (``services/rollout_worker/sim_engine.py``) runs, so a live
    run and the planner share one timing model."""
    return _replica(config), _workload(config, FlowLimits.from_config(config).step_required)
