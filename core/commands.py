"""The controller's commands: what the caller of `core.controller.ControllerCore` must do, in order.

Where it sits: `ControllerCore` returns lists of these; `core.executor.ExecutorCore` says what
each one means as operations on the peers. Frozen, keyword-only and idempotent (a restarted
controller re-issues the commands of the call in progress); `command_to_dict`/`command_from_dict`
persist them with the core's snapshot. Re-exported by `core.controller`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, get_args


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitForSamples:
    """Block until the MessageQueue holds at least `min_queue_size` samples."""
    kind: ClassVar[str] = "wait_for_samples"
    min_queue_size: int

@dataclass(frozen=True, kw_only=True, slots=True)
class RemoveReplicas:
    """Take replicas out of the load balancer (routing cut first, so retries go elsewhere)."""
    kind: ClassVar[str] = "remove_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class AbortReplicas:
    """Abort in-flight requests on the replicas; partial rollouts are retried on the others."""
    kind: ClassVar[str] = "abort_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class SleepReplicas:
    """Free KV cache and offload weights, returning the GPU memory to the trainer."""
    kind: ClassVar[str] = "sleep_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class WakeReplicas:
    """Re-acquire GPU memory on sleeping replicas (the trainer has released it)."""
    kind: ClassVar[str] = "wake_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class SyncWeights:
    """Load weights `version` into the replicas."""
    kind: ClassVar[str] = "sync_weights"
    replica_ids: tuple[str, ...]
    version: int

@dataclass(frozen=True, kw_only=True, slots=True)
class AddReplicas:
    """Register replicas in the load balancer (already-present ones are skipped)."""
    kind: ClassVar[str] = "add_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeReplicas:
    """Let the replicas accept requests again."""
    kind: ClassVar[str] = "resume_replicas"
    replica_ids: tuple[str, ...]

@dataclass(frozen=True, kw_only=True, slots=True)
class Rebalance:
    """Clear sticky sessions, abort and resume all active replicas so retries spread least-loaded."""
    kind: ClassVar[str] = "rebalance"

@dataclass(frozen=True, kw_only=True, slots=True)
class ResetStaleness:
    """Tell the rollouter version `version` is live: reset staleness, close the utilization window."""
    kind: ClassVar[str] = "reset_staleness"
    version: int


Command = (
    WaitForSamples | RemoveReplicas | AbortReplicas | SleepReplicas | WakeReplicas
    | SyncWeights | AddReplicas | ResumeReplicas | Rebalance | ResetStaleness
)  # fmt: skip
COMMAND_TYPES: dict[str, type[Any]] = {cls.kind: cls for cls in get_args(Command)}


def command_to_dict(command: Command) -> dict[str, Any]:
    """Plain dict with the command's `kind` and fields (tuples become lists)."""
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(command).items()}
    return {"kind": command.kind, **data}


def command_from_dict(data: dict[str, Any]) -> Command:
    """Inverse of `command_to_dict`; raises ValueError on an unknown kind."""
    cls = COMMAND_TYPES.get(data.get("kind", ""))
    if cls is None:
        raise ValueError(f"unknown command kind {data.get('kind')!r}")
    kwargs = {f.name: data[f.name] for f in fields(cls)}
    if "replica_ids" in kwargs:
        kwargs["replica_ids"] = tuple(kwargs["replica_ids"])
    command: Command = cls(**kwargs)
    return command
