"""The primitive operations the controller's `ExecutorCore` yields (core/executor.py), one frozen
dataclass each; a driver performs them (the controller service over Redis, the simulator on its
clock) and sends back the result named in the docstring's last line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.schema import AuditEvent, AuditKind, CommandAction

# ---- the primitive operations a driver performs (result in the docstring's last line) ----


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint:
    """The core's decision is made: persist it before anything runs (crash safety). -> None"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadProgress:
    """Read the rollouter's progress for the policy's context. -> RolloutProgress"""


@dataclass(frozen=True, kw_only=True, slots=True)
class AwaitSamples:
    """Return once mq_size >= min_queue_size, or the rollouter cannot produce more
    (`core.sample_lifecycle.RolloutStatus.stalled`), or an admin force ends the wait. -> None"""

    min_queue_size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SetMembers:
    """Add replicas to (or remove them from) the load balancer. -> the members after, in order"""

    replica_ids: tuple[str, ...]
    add: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class SetActiveReplicas:
    """Tell the rollouter how many replicas serve (it recomputes max_concurrent_samples). -> None"""

    num_replicas: int


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerCall:
    """One lifecycle action (abort, sleep, wake, resume) on every replica; waits for live ones. -> None"""

    replica_ids: tuple[str, ...]
    action: CommandAction


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseTrainer:
    """The trainer offloads its GPUs (hybrids wake next). -> None"""


@dataclass(frozen=True, kw_only=True, slots=True)
class AcquireTrainer:
    """The trainer onloads its GPUs now (while the hybrids sleep), not after GPUS_READY. -> None"""


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncReplicas:
    """The trainer brings the replicas to `version`: push, or filesystem fallback. -> WeightSyncReport"""

    replica_ids: tuple[str, ...]
    version: int
    weights_path: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ClearSticky:
    """Forget the load balancer's sticky sessions. -> None"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResetRollouter:
    """Version `version` is live: reset staleness, close the utilization window. -> dict[str, float]"""

    version: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Audit:
    """Record a lifecycle event of the controller (the driver stamps the subject and the time). -> None"""

    event: AuditRecord


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditRecord:
    """The typed fields of a controller AuditEvent (`shared.schema.AuditEvent` documents each)."""

    kind: AuditKind
    version: int = -1
    activated: bool | None = None
    """SWITCH."""
    command: str = ""
    """COMMAND: the core command's kind."""
    replica_ids: tuple[str, ...] = ()
    """COMMAND, PUSH."""
    duration_s: float | None = None
    """COMMAND, PUSH."""
    transport: str = ""
    """PUSH."""
    ok: bool | None = None
    """PUSH."""
    error: str = ""
    """PUSH."""
    decision: dict[str, Any] | None = None
    """DECISION."""
    detail: str = ""
    """Free text for humans."""

    def to_event(self, *, subject: str, t: float) -> AuditEvent:
        return AuditEvent(kind=self.kind, subject=subject, t=t, detail=self.detail, version=self.version,
                          activated=self.activated, command=self.command, replica_ids=list(self.replica_ids),
                          duration_s=self.duration_s, transport=self.transport, ok=self.ok, error=self.error,
                          decision=self.decision)


@dataclass(frozen=True, kw_only=True, slots=True)
class Concurrently:
    """Perform `ops` at the same time (the trainer's offload with the hybrids' wake, its onload with their
    sleep). -> their results"""

    ops: tuple[Op, ...]


Op = (Checkpoint | ReadProgress | AwaitSamples | SetMembers | SetActiveReplicas | WorkerCall | ReleaseTrainer
      | AcquireTrainer | SyncReplicas | ClearSticky | ResetRollouter | Audit | Concurrently)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutProgress:
    """What begin_sync needs from the rollouter."""

    total_generated: int
    completed_steps: int
    cut_samples: int = 0
    """Of total_generated, the samples queued because an abort ended their last response (partial rollout
    off): queued at the abort, whatever the replicas were producing."""
    queue_size: int = -1
    """Samples in the MessageQueue not yet taken by the trainer (-1: not read)."""
    feed_done: bool = False
    """Every prompt has been fed: nothing new will be started."""
    generating: int = 0
    """Samples taken from the feed and not yet queued (the rollouter status' active_tasks)."""
    idle_s: float = -1.0
    """Seconds the rollouter has been idle (paused, nothing generating) since it started (-1: not read)."""
    handed_over: int = 0
    """Samples the last hybrid window handed to the standalones (this version's, before its reset)."""
    handed_over_on_time: int = 0
    """Of those, the samples queued since: they arrived within their window's cycle."""
