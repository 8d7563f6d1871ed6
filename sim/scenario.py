"""Typed simulator scenarios, loaded from YAML (the only place YAML is parsed in ``sim``).

Where it sits: ``sim.cli`` loads a scenario, optionally overrides the policy or
the train/rollout split, and hands it to ``sim.run.simulate``. Section and
parameter names follow the original's config (``async_training``, ``rollout``)
where one exists; the model sections (``workload``, ``replica``, ``trainer``,
``costs``) are the simulator's own and are documented in docs/simulator.md.

Every section is a frozen dataclass validated in ``__post_init__``; unknown keys
are an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be > 0, got {value!r}")


def _non_negative(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value >= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be >= 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    train_gpus: int
    """GPUs of the trainer; with dynamic scheduling they also host the hybrid replicas."""
    rollout_gpus: int
    """GPUs of the standalone rollout pool."""
    gpus_per_replica: int = 8
    """GPUs per inference replica (TP*DP*PP of the rollout engine)."""
    trainer_unit_gpus: int = 8
    """Smallest trainer parallel group (TP*PP*EP); train_gpus must be a multiple."""

    def __post_init__(self) -> None:
        _positive(self, "train_gpus", "gpus_per_replica", "trainer_unit_gpus")
        _non_negative(self, "rollout_gpus")
        for name, unit in (("train_gpus", self.trainer_unit_gpus), ("train_gpus", self.gpus_per_replica),
                           ("rollout_gpus", self.gpus_per_replica)):
            if getattr(self, name) % unit:
                raise ValueError(f"ClusterConfig.{name}={getattr(self, name)} is not a multiple of {unit}")

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
class AsyncTrainingConfig:
    """The original's ``async_training`` + ``rollout`` parameters the schedule depends on."""

    ppo_mini_batch_size: int
    trigger_parameter_sync_step: int
    staleness_threshold: float
    total_rollout_steps: int
    """Prompts (samples) the feed emits over the run."""
    n: int
    """Trajectories per sample (``rollout.n``)."""
    require_batches: int = 1
    partial_rollout: bool = True
    concurrent_samples_per_replica: int = 16
    use_dynamic_resource_scheduling: bool = True
    dynamic_schedule_policy: str = "default"
    dynamic_schedule_deactivate_ratio: float = 0.3
    dynamic_schedule_enable_rebalance: bool = True

    def __post_init__(self) -> None:
        _positive(self, "ppo_mini_batch_size", "trigger_parameter_sync_step", "total_rollout_steps", "n",
                  "require_batches", "concurrent_samples_per_replica")
        _non_negative(self, "staleness_threshold")
        if not self.partial_rollout:
            raise ValueError("AsyncTrainingConfig.partial_rollout=False is not modelled (deactivation truncates)")


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """Token lengths: log-normal, clipped; the response median drifts linearly over the run."""

    prompt_tokens_median: float
    response_tokens_median_start: float
    response_tokens_median_end: float
    prompt_tokens_sigma: float = 0.4
    prompt_tokens_max: int = 4096
    response_tokens_sigma: float = 1.0
    response_tokens_max: int = 65536

    def __post_init__(self) -> None:
        _positive(self, "prompt_tokens_median", "response_tokens_median_start", "response_tokens_median_end",
                  "prompt_tokens_max", "response_tokens_max")
        _non_negative(self, "prompt_tokens_sigma", "response_tokens_sigma")


@dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    """One inference replica: decode step time grows linearly with the running batch."""

    decode_step_s: float
    """Decode step time at batch size -> 0 (seconds per token per request). Calibrated."""
    batch_half_requests: float = 32.0
    """Running batch at which the step time has doubled (throughput saturation scale)."""
    max_running_requests: int = 128
    """Engine cap on concurrently decoding requests; the rest wait in the engine."""
    prefill_tokens_per_s: float = 40000.0
    """Prefill throughput (prompt, and prompt+partial after an abort)."""
    hybrid_speed_factor: float = 1.0
    """Hybrid decode speed relative to a standalone (smaller KV cache at gmu 0.45)."""
    retry_sleep_s: float = 1.0
    """Client back-off after an aborted attempt (original constant)."""

    def __post_init__(self) -> None:
        _positive(self, "decode_step_s", "batch_half_requests", "max_running_requests", "prefill_tokens_per_s",
                  "hybrid_speed_factor")
        _non_negative(self, "retry_sleep_s")

    def step_time_s(self, running: int, speed_factor: float = 1.0) -> float:
        return self.decode_step_s * (1.0 + running / self.batch_half_requests) / speed_factor

    def peak_tokens_per_s(self) -> float:
        """Decode throughput at the engine cap (an upper bound: it grows with the batch)."""
        return self.max_running_requests / self.step_time_s(self.max_running_requests)


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Micro-step time = fixed + tokens * cost / speedup(train_gpus)."""

    seconds_per_ktoken: float
    """Compute seconds per 1000 trained tokens on one trainer unit. Calibrated."""
    fixed_s_per_micro_step: float = 5.0
    """Per micro-step overhead that does not shrink with more GPUs."""
    scaling_efficiency: float = 0.9
    """Speedup per doubling of trainer units is 2 * this (data-parallel efficiency)."""

    def __post_init__(self) -> None:
        _positive(self, "seconds_per_ktoken", "scaling_efficiency")
        _non_negative(self, "fixed_s_per_micro_step")
        if self.scaling_efficiency > 1.0:
            raise ValueError(f"TrainerConfig.scaling_efficiency must be <= 1, got {self.scaling_efficiency}")

    def speedup(self, units: int) -> float:
        import math

        return units * self.scaling_efficiency ** math.log2(units) if units > 1 else 1.0


@dataclass(frozen=True, kw_only=True)
class CostConfig:
    """Fixed costs of weight sync and mode switches, in seconds."""

    standalone_sync_s: float = 6.0
    """Trainer -> standalone NCCL sync, engines paused (checkpoint engine, 30B-A3B: 4.4 s)."""
    hybrid_sync_s: float = 8.0
    """Wake a sleeping hybrid and load the new weights in-process (naive sync)."""
    hybrid_sleep_s: float = 4.0
    """Free KV cache and offload hybrid weights, returning the GPUs to the trainer."""
    rebalance_poll_s: float = 0.2
    """The rebalance drain polls in-flight count at this period (original constant)."""
    monitor_interval_s: float = 10.0
    """Rollouter monitor period: un-pauses when the pause condition cleared."""

    def __post_init__(self) -> None:
        _non_negative(self, "standalone_sync_s", "hybrid_sync_s", "hybrid_sleep_s", "rebalance_poll_s")
        _positive(self, "monitor_interval_s")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    cluster: ClusterConfig
    async_training: AsyncTrainingConfig
    workload: WorkloadConfig
    replica: ReplicaConfig
    trainer: TrainerConfig
    costs: CostConfig = field(default_factory=CostConfig)
    seed: int = 0
    description: str = ""
    reference_hours: dict[str, float] = field(default_factory=dict)
    """Measured wall times to compare against (label -> hours), documentation only."""

    def with_split(self, train_gpus: int, rollout_gpus: int) -> Scenario:
        cluster = dataclasses.replace(self.cluster, train_gpus=train_gpus, rollout_gpus=rollout_gpus)
        return dataclasses.replace(self, cluster=cluster)

    def with_policy(self, policy: str) -> Scenario:
        """Dynamic scheduling with ``policy``; ``static`` means plain fully-async (hybrids never used)."""
        dynamic = policy != "static"
        name = policy if dynamic else "static_fully_async"
        cfg = dataclasses.replace(self.async_training, dynamic_schedule_policy=name,
                                  use_dynamic_resource_scheduling=dynamic)
        return dataclasses.replace(self, async_training=cfg)

    def with_prompts(self, total_rollout_steps: int) -> Scenario:
        cfg = dataclasses.replace(self.async_training, total_rollout_steps=total_rollout_steps)
        return dataclasses.replace(self, async_training=cfg)

    def with_section(self, section: str, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **changes)})


T = TypeVar("T")


def _build(cls: type[T], raw: Any, where: str) -> T:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(names)}")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc


_SECTIONS: dict[str, type] = {
    "cluster": ClusterConfig,
    "async_training": AsyncTrainingConfig,
    "workload": WorkloadConfig,
    "replica": ReplicaConfig,
    "trainer": TrainerConfig,
    "costs": CostConfig,
}


def scenario_from_dict(raw: dict[str, Any], *, where: str = "scenario") -> Scenario:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping at top level")
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SECTIONS:
            fields[key] = _build(_SECTIONS[key], value, f"{where}.{key}")
        elif key in ("name", "seed", "description", "reference_hours"):
            fields[key] = value
        else:
            raise ValueError(f"{where}: unknown top-level key {key!r}")
    try:
        return Scenario(**fields)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def load_scenario(path: str | Path) -> Scenario:
    text = Path(path).read_text()
    return scenario_from_dict(yaml.safe_load(text), where=str(path))
