"""Typed run configuration, parsed from YAML in one place (STYLE.md rule 8).

Where it sits: `dynsched run --config FILE` loads this once and hands the same
file to every service process; each service reads the sections it needs.
Parameter names follow the original system (`async_training.*`,
`rollout.*`) so users can port their configs. Every value is validated in
`__post_init__`; a wrong value raises ValueError naming the key and value,
an unknown key raises ValueError listing the known ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


def _check(condition: bool, key: str, value: Any, expected: str) -> None:
    if not condition:
        raise ValueError(f"config: {key}={value!r} is invalid: expected {expected}")


@dataclass(frozen=True, kw_only=True)
class ResponseLengthConfig:
    """Sim response lengths in tokens: normal(mean, std) clipped to [min, max], drifting with version."""

    mean: float = 256.0
    std: float = 64.0
    min_tokens: int = 8
    drift_per_version: float = 0.0
    """Fractional growth of the mean per weight version (RL responses lengthen)."""

    def __post_init__(self) -> None:
        _check(self.mean > 0, "response_length.mean", self.mean, "> 0")
        _check(self.std >= 0, "response_length.std", self.std, ">= 0")
        _check(self.min_tokens >= 1, "response_length.min_tokens", self.min_tokens, ">= 1")


@dataclass(frozen=True, kw_only=True)
class SimEngineConfig:
    """Timing model of one GPU rollout replica (seconds are modelled seconds, see run.time_scale)."""

    prefill_s_per_token: float = 0.0002
    decode_s_per_step: float = 0.02
    """Time of one decode step (one token for every running request) at batch size 1."""
    batch_slowdown: float = 0.002
    """A decode step takes decode_s_per_step * (1 + batch_slowdown * running_requests)."""
    sleep_s: float = 2.0
    wake_s: float = 2.0
    weight_sync_s: float = 1.0
    response_length: ResponseLengthConfig = field(default_factory=ResponseLengthConfig)

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_step", "batch_slowdown", "sleep_s", "wake_s", "weight_sync_s"):
            value = getattr(self, name)
            _check(value >= 0, f"rollout.sim.{name}", value, ">= 0")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    name: str = "dynsched"
    time_scale: float = 1.0
    """Wall seconds per modelled second for sim backends (0.01 = 100x faster than a GPU)."""
    seed: int = 0
    namespace: str = "dynsched"
    admin_port: int = 0
    """Controller admin API port; 0 picks a free one (published in Redis for the CLI)."""
    work_dir: str = "runs/work"
    """Real backends: published weight versions (`weights/`) and trainer checkpoints (`checkpoints/`)."""

    def __post_init__(self) -> None:
        _check(self.time_scale > 0, "run.time_scale", self.time_scale, "> 0")
        _check(0 <= self.admin_port < 65536, "run.admin_port", self.admin_port, "0..65535")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    total_rollout_steps: int
    """Number of prompts (samples) to generate over the run."""
    n: int = 4
    """Responses per prompt (rollout.n in the original)."""
    task: str = "sim"
    """'sim' (synthetic prompts, modelled reward) or 'addition' (rl.task, exact-match reward)."""
    max_response_length: int = 1024
    prompt_length: int = 64

    def __post_init__(self) -> None:
        _check(self.total_rollout_steps >= 1, "data.total_rollout_steps", self.total_rollout_steps, ">= 1")
        _check(self.n >= 1, "data.n", self.n, ">= 1")
        _check(self.task in ("sim", "addition"), "data.task", self.task, "'sim' or 'addition'")
        _check(self.max_response_length >= 1, "data.max_response_length", self.max_response_length, ">= 1")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    ppo_mini_batch_size: int
    num_gpus: int = 8
    backend: str = "sim"
    time_per_sample_s: float = 1.0
    """Sim: modelled seconds of training compute per sample on ONE trainer GPU."""
    offload_s: float = 1.0
    """Sim: modelled seconds to offload/onload training state when hybrids need the GPUs."""
    model_dir: str = ""
    """torch backend: the model directory (built by `python -m rl.model build`)."""
    checkpoint_dir: str = ""
    learning_rate: float = 3e-4

    def __post_init__(self) -> None:
        _check(self.ppo_mini_batch_size >= 1, "trainer.ppo_mini_batch_size", self.ppo_mini_batch_size, ">= 1")
        _check(self.num_gpus >= 1, "trainer.num_gpus", self.num_gpus, ">= 1")
        _check(self.backend in ("sim", "torch"), "trainer.backend", self.backend, "'sim' or 'torch'")
        _check(self.time_per_sample_s >= 0, "trainer.time_per_sample_s", self.time_per_sample_s, ">= 0")


@dataclass(frozen=True, kw_only=True)
class AsyncTrainingConfig:
    """The original's `async_training` section, same names and defaults."""

    staleness_threshold: float = 0.1
    trigger_parameter_sync_step: int = 4
    require_batches: int = 1
    partial_rollout: bool = True
    use_dynamic_resource_scheduling: bool = False
    dynamic_schedule_policy: str = "default"
    dynamic_schedule_policy_module: str = ""
    """Importable module holding a user policy; importing it runs its @register_policy."""
    dynamic_schedule_deactivate_ratio: float = 0.3
    dynamic_schedule_enable_rebalance: bool = True
    concurrent_samples_per_replica: int = 16

    def __post_init__(self) -> None:
        key = "async_training."
        _check(self.staleness_threshold >= 0, key + "staleness_threshold", self.staleness_threshold, ">= 0")
        _check(self.trigger_parameter_sync_step >= 1, key + "trigger_parameter_sync_step",
               self.trigger_parameter_sync_step, ">= 1")
        _check(self.require_batches >= 1, key + "require_batches", self.require_batches, ">= 1")
        _check(0.0 <= self.dynamic_schedule_deactivate_ratio <= 1.0, key + "dynamic_schedule_deactivate_ratio",
               self.dynamic_schedule_deactivate_ratio, "within [0, 1]")
        _check(self.concurrent_samples_per_replica >= 1, key + "concurrent_samples_per_replica",
               self.concurrent_samples_per_replica, ">= 1")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Standalone pool (`nnodes` x `n_gpus_per_node`) and replica shape."""

    nnodes: int = 1
    n_gpus_per_node: int = 8
    tensor_model_parallel_size: int = 8
    """GPUs per replica; hybrids number trainer.num_gpus // this."""
    backend: str = "sim"
    retry_delay_s: float = 1.0
    """Partial-rollout retry delay after an abort (the original sleeps 1 s)."""
    gpu_memory_utilization: float = 0.1
    """vLLM: fraction of GPU memory per replica (on CPU builds: of host RAM)."""
    temperature: float = 1.0
    max_model_len: int = 64
    max_num_seqs: int = 128
    standalone_weight_transport: str = "filesystem"
    """How standalones get new weights: 'filesystem' (reload a version directory), or a push the
    trainer drives, falling back to the filesystem if it fails: 'nccl' (CUDA) or 'gloo' (CPU)."""
    hybrid_weight_transport: str = "filesystem"
    """Same for hybrids: 'filesystem', 'ipc' (CUDA IPC on the trainer's GPUs) or 'gloo'."""
    weight_transfer_address: str = "127.0.0.1"
    """The trainer's address as the workers reach it (nccl/gloo rendezvous)."""
    weight_transfer_port: int = 0
    """The trainer's rendezvous port (nccl/gloo), published for workers on other hosts; a second
    push group (hybrids on gloo) takes the next port. 0: a free port per group (one host only)."""
    weight_push_timeout_s: float = 300.0
    """Deadline of one push (trainer) and of one push step (worker): past it the trainer aborts its
    communicator and the worker exits to be restarted (docs/real_training.md)."""
    hybrid_kv_cache_memory_bytes: int = 0
    """vLLM's kv_cache_memory_bytes for hybrids (0: sized from gpu_memory_utilization); what a
    hybrid re-allocates on every wake on the trainer's GPU."""
    sim: SimEngineConfig = field(default_factory=SimEngineConfig)

    def __post_init__(self) -> None:
        _check(self.nnodes >= 0, "rollout.nnodes", self.nnodes, ">= 0")
        _check(self.n_gpus_per_node >= 1, "rollout.n_gpus_per_node", self.n_gpus_per_node, ">= 1")
        _check(self.tensor_model_parallel_size >= 1, "rollout.tensor_model_parallel_size",
               self.tensor_model_parallel_size, ">= 1")
        _check(self.backend in ("sim", "vllm"), "rollout.backend", self.backend, "'sim' or 'vllm'")
        _check(self.retry_delay_s >= 0, "rollout.retry_delay_s", self.retry_delay_s, ">= 0")
        _check(0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization",
               self.gpu_memory_utilization, "within (0, 1]")
        _check(self.temperature > 0, "rollout.temperature", self.temperature, "> 0")
        _check(self.standalone_weight_transport in ("filesystem", "nccl", "gloo"),
               "rollout.standalone_weight_transport", self.standalone_weight_transport,
               "'filesystem', 'nccl' or 'gloo'")
        _check(self.hybrid_weight_transport in ("filesystem", "ipc", "gloo"), "rollout.hybrid_weight_transport",
               self.hybrid_weight_transport, "'filesystem', 'ipc' or 'gloo'")
        _check(0 <= self.weight_transfer_port < 65535, "rollout.weight_transfer_port",
               self.weight_transfer_port, "0 (a free port) or a TCP port below 65535")
        _check(self.weight_push_timeout_s > 0, "rollout.weight_push_timeout_s",
               self.weight_push_timeout_s, "> 0")
        _check(self.hybrid_kv_cache_memory_bytes >= 0, "rollout.hybrid_kv_cache_memory_bytes",
               self.hybrid_kv_cache_memory_bytes, ">= 0")

    @property
    def num_standalone_gpus(self) -> int:
        return self.nnodes * self.n_gpus_per_node


@dataclass(frozen=True, kw_only=True)
class Config:
    data: DataConfig
    trainer: TrainerConfig
    run: RunConfig = field(default_factory=RunConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        tp = self.rollout.tensor_model_parallel_size
        _check(self.rollout.num_standalone_gpus % tp == 0, "rollout.n_gpus_per_node",
               self.rollout.n_gpus_per_node, f"standalone GPUs divisible by tensor_model_parallel_size={tp}")
        if self.async_training.use_dynamic_resource_scheduling:
            _check(self.trainer.num_gpus % tp == 0, "trainer.num_gpus", self.trainer.num_gpus,
                   f"divisible by tensor_model_parallel_size={tp} to host hybrid replicas")
        if self.rollout.backend == "vllm" or self.trainer.backend == "torch":
            _check(bool(self.trainer.model_dir), "trainer.model_dir", self.trainer.model_dir,
                   "a model directory (build one with `python -m rl.model build --out DIR`)")
        for key in ("standalone_weight_transport", "hybrid_weight_transport"):
            value = getattr(self.rollout, key)
            _check(value == "filesystem" or (self.rollout.backend == "vllm" and self.trainer.backend == "torch"),
                   f"rollout.{key}", value, "'filesystem' unless rollout.backend is vllm and trainer.backend torch")
        _check(bool(self.standalone_ids or self.hybrid_ids), "rollout.nnodes", self.rollout.nnodes,
               ">= 1, or use_dynamic_resource_scheduling with hybrid replicas (colocated mode)")

    @property
    def standalone_ids(self) -> tuple[str, ...]:
        num = self.rollout.num_standalone_gpus // self.rollout.tensor_model_parallel_size
        return tuple(f"standalone_{i}" for i in range(num))

    @property
    def hybrid_ids(self) -> tuple[str, ...]:
        if not self.async_training.use_dynamic_resource_scheduling:
            return ()
        num = self.trainer.num_gpus // self.rollout.tensor_model_parallel_size
        return tuple(f"hybrid_{i}" for i in range(num))

    @property
    def only_hybrid(self) -> bool:
        return not self.standalone_ids

    def weight_transport(self, replica_id: str) -> str:
        """The configured weight transport of a replica ('filesystem' or a push transport)."""
        if replica_id in self.hybrid_ids:
            return self.rollout.hybrid_weight_transport
        return self.rollout.standalone_weight_transport


def load_config(path: str | Path) -> Config:
    """Read a YAML file into a validated Config."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"config: {path} must hold a mapping at the top level")
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any]) -> Config:
    return _build(Config, data, "")


def config_to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _build(cls: Any, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"config: {prefix or 'top level'} must be a mapping, got {data!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"config: unknown key(s) {', '.join(prefix + k for k in unknown)}; "
                         f"known under {prefix or 'top level'}: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        annotation = str(known[name].type)
        nested = _NESTED.get(annotation)
        kwargs[name] = _build(nested, value, f"{prefix}{name}.") if nested else _scalar(annotation, value, prefix + name)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"config: {prefix or 'top level'}: {exc}") from exc


def _scalar(annotation: str, value: Any, key: str) -> Any:
    expected = _SCALAR_TYPES.get(annotation)
    if expected is None:
        return value
    if isinstance(value, bool) and annotation != "bool":
        raise ValueError(f"config: {key}={value!r} is invalid: expected {annotation}")
    if not isinstance(value, expected):
        raise ValueError(f"config: {key}={value!r} is invalid: expected {annotation}")
    return float(value) if annotation == "float" else value


_SCALAR_TYPES: dict[str, Any] = {"int": int, "float": (int, float), "bool": bool, "str": str}

_NESTED: dict[str, Any] = {
    "DataConfig": DataConfig,
    "TrainerConfig": TrainerConfig,
    "RunConfig": RunConfig,
    "AsyncTrainingConfig": AsyncTrainingConfig,
    "RolloutConfig": RolloutConfig,
    "SimEngineConfig": SimEngineConfig,
    "ResponseLengthConfig": ResponseLengthConfig,
}
