"""Typed run configuration, parsed from YAML in one place (STYLE.md rule 8).

Where it sits: `dynsched run --config FILE` loads this once and hands the same
file to every service process; each service reads the sections it needs, and
`dynsched simulate --config FILE` reads the very same file (plus the optional
`simulator` section, shared/sim_config.py, for what only the planner needs).
Parameter names follow the original system (`async_training.*`, `rollout.*`)
so users can port their configs.

Each section is a frozen pydantic model: unknown keys, wrong types, NaN and
infinities are rejected, numbers are range-checked per field, and the
cross-section rules live in `Config`'s validator. Every failure surfaces as one
`ConfigError` (a ValueError) on one line naming the file, the key path and the
value, e.g. `config: run.yaml: async_training.staleness_threshold=inf is
invalid: expected a finite number`. docs/contracts.md explains why pydantic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.config_errors import ConfigError, format_errors
from shared.names import (
    DEAD_LETTER_MAXLEN,
    EVENT_STREAM_MAXLEN,
    EVENT_STREAM_MIN_MAXLEN,
    REDIS_RETRY_WINDOW_S,
    STREAM_RETENTION_S,
)
from shared.sim_config import PhysicsConfig, PublishedRow

__all__ = ["Config", "ConfigError", "config_from_dict", "config_json_schema", "config_to_dict", "load_config",
           "replace_config"]

ROLLOUTER_MONITOR_INTERVAL_S = 0.1
"""Wall seconds between two looks of the rollouter's monitor at the pause condition."""
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.-]+$"
"""Redis key prefix of a run: no glob characters, so `--fresh` can only ever match this run's keys."""

NonNegative = Annotated[float, Field(ge=0)]
"""Finite (every section forbids NaN and infinities) and never negative."""
Seconds = NonNegative
"""A duration."""
Positive = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)


class ResponseLengthConfig(_Section):
    """Sim response lengths in tokens: normal(mean, std) clipped to [min, max], drifting with version."""

    mean: Positive = 256.0
    std: NonNegative = 64.0
    min_tokens: Count = 8
    drift_per_version: float = 0.0
    """Fractional growth of the mean per weight version (RL responses lengthen)."""


class SimEngineConfig(_Section):
    """Timing model of one GPU rollout replica (seconds are modelled seconds, see run.time_scale)."""

    prefill_s_per_token: Seconds = 0.0002
    decode_s_per_step: Seconds = 0.02
    """Time of one decode step (one token for every running request) at batch size 1."""
    batch_slowdown: NonNegative = 0.002
    """A decode step takes decode_s_per_step * (1 + batch_slowdown * running_requests)."""
    sleep_s: Seconds = 2.0
    wake_s: Seconds = 2.0
    weight_sync_s: Seconds = 1.0
    response_length: ResponseLengthConfig = Field(default_factory=ResponseLengthConfig)


class RunConfig(_Section):
    name: str = "dynsched"
    time_scale: Positive = 1.0
    """Wall seconds per modelled second for sim backends (0.01 = 100x faster than a GPU)."""
    seed: int = 0
    namespace: Annotated[str, Field(pattern=NAMESPACE_PATTERN)] = "dynsched"
    """Prefix of every Redis key of the run; letters, digits, '_', '.' and '-' only."""
    admin_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Controller admin API port; 0 picks a free one (published in Redis for the CLI)."""
    admin_host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    """Address the admin API binds. Anything but a loopback address needs an admin token
    (DYNSCHED_ADMIN_TOKEN or DYNSCHED_ADMIN_TOKEN_FILE) and then requires it on every endpoint."""
    loop_stale_s: Positive = 120.0
    """Wall seconds without progress after which a service loop counts as stuck (health: 503)."""
    hung_grace_s: Positive | None = None
    """`dynsched run`/`up` SIGKILL (and restart) a child whose health report has been missing or stale
    for this long, counted from its first report; unset: `loop_stale_s` (docs/reliability.md)."""
    work_dir: str = "runs/work"
    """Real backends: published weight versions (`weights/`) and trainer checkpoints (`checkpoints/`)."""
    redis_retry_window_s: Seconds = REDIS_RETRY_WINDOW_S
    """Every Redis call retries an unreachable Redis with backoff this long, then fails
    (docs/reliability.md)."""
    stream_retention_s: Seconds = STREAM_RETENTION_S
    """Acked entries of every consumer-group stream (MessageQueue, requests, results, commands) older than
    this are trimmed (XTRIM MINID below the oldest entry a group still needs)."""
    dead_letter_maxlen: Count = DEAD_LETTER_MAXLEN
    """The dead-letter stream keeps about this many newest entries (MAXLEN ~)."""
    event_stream_maxlen: Annotated[int, Field(ge=EVENT_STREAM_MIN_MAXLEN)] = EVENT_STREAM_MAXLEN
    """The streams no consumer group reads (audit, metrics, controller:acks) keep about this many
    newest entries (MAXLEN ~ on each XADD); `dynsched run` exports audit and metrics to its JSONL
    files as they come, so these hold every entry (docs/reliability.md)."""
    max_restarts_per_minute: Annotated[int, Field(ge=0)] = 5
    """`dynsched run`/`up` restart a crashed service with backoff; one more crash within a minute fails
    the run (0: never restart)."""

    @property
    def hang_grace_s(self) -> float:
        """`hung_grace_s`, or `loop_stale_s` when unset."""
        return self.loop_stale_s if self.hung_grace_s is None else self.hung_grace_s

    @property
    def stuck_loop_exit_s(self) -> float:
        """A service loop without a beat for this long ends its own process (shared.runtime): the
        launcher's budget for a hung child, `loop_stale_s` + `hang_grace_s` (240 s by default)."""
        return self.loop_stale_s + self.hang_grace_s


class DataConfig(_Section):
    total_rollout_steps: Count
    """Number of prompts (samples) to generate over the run."""
    n: Count = 4
    """Responses per prompt (rollout.n in the original)."""
    task: Literal["sim", "addition"] = "sim"
    """'sim' (synthetic prompts, modelled reward) or 'addition' (rl.task, exact-match reward)."""
    max_response_length: Count = 1024
    prompt_length: Count = 64


class TrainerConfig(_Section):
    ppo_mini_batch_size: Count
    num_gpus: Count = 8
    backend: Literal["sim", "torch"] = "sim"
    time_per_sample_s: Seconds = 1.0
    """Sim: modelled seconds of training compute per sample on ONE trainer GPU."""
    offload_s: Seconds = 1.0
    """Sim: modelled seconds to offload/onload training state when hybrids need the GPUs."""
    model_dir: str = ""
    """torch backend: the model directory (built by `python -m rl.model build`)."""
    checkpoint_dir: str = ""
    learning_rate: Positive = 3e-4


class AsyncTrainingConfig(_Section):
    """The original's `async_training` section, same names and defaults."""

    staleness_threshold: NonNegative = 0.1
    trigger_parameter_sync_step: Count = 4
    require_batches: Count = 1
    partial_rollout: bool = True
    """False: an aborted response is trained cut where it stopped, at every abort (syncs too), as verl."""
    use_dynamic_resource_scheduling: bool = False
    dynamic_schedule_policy: str = "default"
    """A registered policy name (built-ins: adaptive, default, fixed_ratio, static_fully_async)."""
    dynamic_schedule_policy_module: str = ""
    """Importable module holding a user policy; importing it runs its @register_policy."""
    dynamic_schedule_deactivate_ratio: Annotated[float, Field(ge=0, le=1)] = 0.3
    dynamic_schedule_enable_rebalance: bool = True
    concurrent_samples_per_replica: Count = 16
    hybrid_concurrent_samples_per_replica: Count | None = None
    """Samples the rollouter keeps in flight per *hybrid* replica while the hybrids serve (None: as many
    as `concurrent_samples_per_replica`). A hybrid shares its GPUs with the trainer's offloaded state, so
    its KV cache is often smaller; and on an engine whose decode step grows with the batch, fewer samples
    started on the hybrids means less unfinished work handed to the standalones when the hybrids sleep
    (docs/scheduling.md, "Samples in flight on the hybrids"); `dynsched plan --hybrid-concurrency` tries
    values."""
    dynamic_schedule_fold_hybrid_sync: bool = False
    """Activation wakes the hybrids first and syncs them in the standalones' weight sync instead of
    after it (false: the seed's order, standalone sync -> wake -> hybrid sync)."""
    dynamic_schedule_overlap_wake: bool = False
    """The trainer's offload and the hybrids' wake run at once (only where the GPU memory holds both
    the trainer's resident state and the hybrids' weights + KV); false: offload, then wake."""
    dynamic_schedule_overlap_sleep: bool = False
    """The trainer's onload and the hybrids' sleep run at once, before the trainer is told its GPUs are
    ready (the same memory condition as overlap_wake); false: sleep, then the trainer onloads."""


class RolloutConfig(_Section):
    """Standalone pool (`nnodes` x `n_gpus_per_node`) and replica shape."""

    nnodes: Annotated[int, Field(ge=0)] = 1
    n_gpus_per_node: Count = 8
    tensor_model_parallel_size: Count = 8
    """GPUs per replica; hybrids number trainer.num_gpus // this."""
    backend: Literal["sim", "vllm"] = "sim"
    retry_delay_s: Seconds = 1.0
    """Partial-rollout retry delay after an abort (the original sleeps 1 s)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.1
    """vLLM: fraction of GPU memory per replica (on CPU builds: of host RAM)."""
    temperature: Positive = 1.0
    max_model_len: Count = 64
    max_num_seqs: Count = 128
    """Engine cap on concurrently running requests (the simulator queues the rest in the engine)."""
    standalone_weight_transport: Literal["filesystem", "nccl", "gloo"] = "filesystem"
    """How standalones get new weights: 'filesystem' (reload a version directory), or a push the
    trainer drives, falling back to the filesystem if it fails: 'nccl' (CUDA) or 'gloo' (CPU)."""
    hybrid_weight_transport: Literal["filesystem", "ipc", "gloo"] = "filesystem"
    """Same for hybrids: 'filesystem', 'ipc' (CUDA IPC on the trainer's GPUs) or 'gloo'."""
    weight_transfer_address: str = "127.0.0.1"
    """The trainer's address as the workers reach it (nccl/gloo rendezvous)."""
    weight_transfer_port: Annotated[int, Field(ge=0, lt=65535)] = 0
    """The trainer's rendezvous port (nccl/gloo), published for workers on other hosts; a second
    push group (hybrids on gloo) takes the next port. 0: a free port per group (one host only)."""
    weight_push_timeout_s: Positive = 300.0
    """Deadline of one push (trainer) and of one push step (worker): past it the trainer aborts its
    communicator and the worker exits to be restarted (docs/real_training.md)."""
    worker_start_timeout_s: Seconds = 600.0
    """How long a fresh controller waits for every replica's worker to finish starting (load its
    engine; a hybrid also puts it to sleep) before it handles the trainer's first event, as the
    original starts and sleeps its hybrids before training. Past it the controller goes on; a
    replica still starting gets each command when it starts, and the first wake waits for it."""
    hybrid_kv_cache_memory_bytes: Annotated[int, Field(ge=0)] = 0
    """vLLM's kv_cache_memory_bytes for hybrids (0: sized from gpu_memory_utilization); what a
    hybrid re-allocates on every wake on the trainer's GPU."""
    sim: SimEngineConfig = Field(default_factory=SimEngineConfig)

    @property
    def num_standalone_gpus(self) -> int:
        return self.nnodes * self.n_gpus_per_node


class SimWorkloadConfig(_Section):
    """Simulator: log-normal token lengths, clipped (responses also at data.max_response_length), drifting.
    Without this section the simulator draws what the sim engine draws (`rollout.sim.response_length`)."""

    prompt_tokens_median: Positive
    response_tokens_median_start: Positive
    response_tokens_median_end: Positive
    prompt_tokens_sigma: NonNegative = 0.4
    prompt_tokens_max: Count = 4096
    response_tokens_sigma: NonNegative = 1.0
    response_tokens_max: Count = 65536
    max_length_share: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of responses that run to response_tokens_max (repetition, no EOS) instead of the log-normal."""
    drift_horizon_samples: Count | None = None
    """Samples over which the median drifts (unset: the run's prompts); set it so a shortened run
    (--prompts) is the start of the same run."""


class SimTrainerConfig(_Section):
    """Simulator: a micro-step also costs fixed + tokens * cost / speedup(units), on top of
    `trainer.time_per_sample_s` (set that to 0 to use only this token-based model)."""

    seconds_per_ktoken: Seconds = 0.0
    """Compute seconds per 1000 trained tokens on one trainer unit."""
    fixed_s_per_micro_step: Seconds = 0.0
    """Per micro-step overhead that does not shrink with more GPUs."""
    scaling_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Speedup per doubling of trainer units is 2 * this (data-parallel efficiency)."""
    collect_s_per_sample: Seconds = 0.0
    """Trainer-side cost per sample of taking and assembling a batch once its samples are queued
    (fetch, deserialize, pad: one pass over each sample); inside timing_s/gen, independent of the
    trainer's GPUs."""


class SimulatorConfig(_Section):
    """What only `dynsched simulate` / `plan` need; everything else comes from the run sections."""

    description: str = ""
    reference_hours: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    """Measured wall times to compare against (label -> hours), documentation only."""
    trainer_unit_gpus: Count = 1
    """Smallest trainer parallel group (TP*PP*EP); the planner moves GPUs in multiples of it."""
    hybrid_speed_factor: Positive = 1.0
    """Hybrid decode speed relative to a standalone (e.g. a smaller KV cache)."""
    monitor_interval_s: Annotated[float, Field(gt=0)] | None = None
    """Rollouter monitor period in modelled seconds; unset: the rollouter service's 0.1 wall
    seconds, i.e. 0.1 / run.time_scale, as the live system (the original verl checks every 10 s)."""
    workload: SimWorkloadConfig | None = None
    trainer: SimTrainerConfig = Field(default_factory=SimTrainerConfig)
    physics: PhysicsConfig | None = None
    """Decode and training costs from the accelerator's peaks (replaces rollout.sim's decode step and
    batch slowdown and simulator.trainer.seconds_per_ktoken / scaling_efficiency; sim/physics.py)."""
    published: list[PublishedRow] = Field(default_factory=list)
    """Published or measured runs of this workload: the calibration rows and the validation table."""


def _check(condition: bool, key: str, value: Any, expected: str) -> None:
    if not condition:
        raise ValueError(f"{key}={value!r} is invalid: expected {expected}")


class Config(_Section):
    """One run: what `dynsched run` starts and `dynsched simulate` models."""

    data: DataConfig
    trainer: TrainerConfig
    run: RunConfig = Field(default_factory=RunConfig)
    async_training: AsyncTrainingConfig = Field(default_factory=AsyncTrainingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    """Only `dynsched simulate` / `plan` read this: workload shape and timing priors (docs/simulator.md)."""

    @model_validator(mode="after")
    def _check_across_sections(self) -> Config:
        tp = self.rollout.tensor_model_parallel_size
        _check(self.rollout.num_standalone_gpus % tp == 0, "rollout.n_gpus_per_node",
               self.rollout.n_gpus_per_node, f"standalone GPUs divisible by tensor_model_parallel_size={tp}")
        if self.async_training.use_dynamic_resource_scheduling:
            _check(self.trainer.num_gpus % tp == 0, "trainer.num_gpus", self.trainer.num_gpus,
                   f"divisible by tensor_model_parallel_size={tp} to host hybrid replicas")
        unit = self.simulator.trainer_unit_gpus
        _check(self.trainer.num_gpus % unit == 0, "trainer.num_gpus", self.trainer.num_gpus,
               f"a multiple of simulator.trainer_unit_gpus={unit}")
        if self.rollout.backend == "vllm" or self.trainer.backend == "torch":
            _check(bool(self.trainer.model_dir), "trainer.model_dir", self.trainer.model_dir,
                   "a model directory (build one with `python -m rl.model build --out DIR`)")
        for key in ("standalone_weight_transport", "hybrid_weight_transport"):
            value = getattr(self.rollout, key)
            pushable = self.rollout.backend == "vllm" and self.trainer.backend == "torch"
            _check(value == "filesystem" or pushable, f"rollout.{key}", value,
                   "'filesystem' unless rollout.backend is vllm and trainer.backend torch")
        _check(bool(self.standalone_ids or self.hybrid_ids), "rollout.nnodes", self.rollout.nnodes,
               ">= 1, or use_dynamic_resource_scheduling with hybrid replicas (colocated mode)")
        return self

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
    """Read a YAML file into a validated Config; any problem is one ConfigError line naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config: {path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config: {where}: YAML syntax error: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path}: expected a mapping of sections at the top level, "
                          f"got {type(data).__name__}")
    return config_from_dict(data, source=str(path))


def config_from_dict(data: dict[str, Any], *, source: str = "") -> Config:
    """Validate a plain dict (as YAML gives it); `source` names the file in error messages."""
    prefix = f"config: {source}: " if source else "config: "
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(prefix + format_errors(exc, Config)) from None


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain data (YAML/JSON-safe) that `config_from_dict` reads back into an equal Config."""
    return config.model_dump(mode="python")


def replace_config(config: Config, changes: dict[str, Any]) -> Config:
    """A re-validated copy with dotted keys changed, e.g. {"trainer.num_gpus": 8}."""
    data = config_to_dict(config)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        if leaf not in node:
            raise ConfigError(f"config: unknown key {dotted}")
        node[leaf] = value
    return config_from_dict(data)


def config_json_schema() -> dict[str, Any]:
    """JSON schema of the config file, for editors (`dynsched config-schema`)."""
    schema = Config.model_json_schema()
    schema["title"] = "dynsched run config"
    return schema
