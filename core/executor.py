"""What the controller does with each trainer handshake: the command semantics, pure (sans-I/O).

Where it sits: `ControllerCore` decides *which* commands run and in which order;
`ExecutorCore` says what each command *means*, as a sequence of primitive
operations (`Op`) on the peers: load-balancer membership, worker lifecycle
calls, the trainer's GPU release and weight sync, the rollouter's replica count
and staleness reset. It never performs them. Its methods are generators
(a `Plan`): they yield one `Op` at a time and are sent back its result, so

- the controller service (`services/controller`) performs each op over Redis, and
- the simulator (`sim/run.py`) performs each op on its virtual clock with its
  GPU timing models,

and both run exactly these semantics, in this order. Durations come from the
injected `clock` (time.monotonic live, the virtual clock in the simulator).

Per handshake (seed ordering):

    on_micro_step_start -> Checkpoint, [AwaitSamples, SetMembers(remove), WorkerCall(abort),
                           WorkerCall(sleep)] -> finish_deactivate -> GPUS_READY
    on_collected        -> record_collection
    on_weights_ready    -> ReadProgress, Checkpoint, [SyncReplicas(standalones),
                           ReleaseTrainer, WorkerCall(wake), SyncReplicas(hybrids), SetMembers(add),
                           WorkerCall(resume), rebalance, ResetRollouter] -> finish_activate,
                           finish_sync -> SYNC_DONE

The trainer's offload (ReleaseTrainer) runs just before the hybrids wake, after the
standalone sync, so a push to the standalones reads GPU-resident weights.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core import controller as cc
from core.controller import ControllerCore, Mode
from shared.schema import (
    AuditEvent,
    AuditKind,
    CommandAction,
    PushGroupReport,
    TrainerAction,
    TrainerEvent,
    TrainerReply,
    WeightSyncReport,
)

T = TypeVar("T")
Plan = Generator["Op", Any, T]
"""A generator of ops; the driver sends each op's result back and gets the plan's value at the end."""


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
    detail: str = ""
    """Free text for humans."""

    def to_event(self, *, subject: str, t: float) -> AuditEvent:
        return AuditEvent(kind=self.kind, subject=subject, t=t, detail=self.detail, version=self.version,
                          activated=self.activated, command=self.command, replica_ids=list(self.replica_ids),
                          duration_s=self.duration_s, transport=self.transport, ok=self.ok, error=self.error)


Op = (Checkpoint | ReadProgress | AwaitSamples | SetMembers | SetActiveReplicas | WorkerCall | ReleaseTrainer
      | SyncReplicas | ClearSticky | ResetRollouter | Audit)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutProgress:
    """What begin_sync needs from the rollouter."""

    total_generated: int
    completed_steps: int


@dataclass
class ExecutionReport:
    """What executing one command list measured."""

    wait_for_enough_samples_s: float = 0.0
    switch_s: float = 0.0
    """Time in lifecycle commands (remove/abort/sleep or wake/sync-hybrids/add/resume/rebalance)."""
    standalone_sync_s: float = 0.0
    trainer_release_s: float = 0.0
    """Time the trainer took to offload before the hybrids woke (not part of switch_s)."""
    pushes: int = 0
    push_fallbacks: int = 0
    activated: bool = False
    rollouter_report: dict[str, float] = field(default_factory=dict)
    """The rollouter's metrics of the closed version (RolloutReport.metrics)."""

    def cycle_metrics(self) -> dict[str, float]:
        """The sync's contribution to its cycle's metrics (the rollouter's report included)."""
        return {
            **{k: float(v) for k, v in self.rollouter_report.items()},
            "timing_s/activate": self.switch_s if self.activated else 0.0,
            "timing_s/standalone_sync": self.standalone_sync_s,
            "timing_s/trainer_release": self.trainer_release_s,
            "weights/pushes": float(self.pushes),
            "weights/push_fallbacks": float(self.push_fallbacks),
        }


_WORKER_ACTIONS: dict[type, CommandAction] = {
    cc.AbortReplicas: CommandAction.ABORT, cc.SleepReplicas: CommandAction.SLEEP,
    cc.WakeReplicas: CommandAction.WAKE, cc.ResumeReplicas: CommandAction.RESUME,
}


class ExecutorCore:
    """The controller's handshake handling around a ControllerCore; yields ops, performs none."""

    def __init__(self, *, core: ControllerCore, clock: Callable[[], float]) -> None:
        self.core = core
        self.clock = clock
        self.serving_hybrids: tuple[str, ...] = core.hybrid_ids if core.mode is Mode.HYBRID_ACTIVE else ()
        """Hybrids the load balancer routes to (from its last membership answer)."""
        self.last_report = ExecutionReport()
        """The report of the last weights_ready handled (its cycle's sync metrics)."""

    # ---- handshakes ----

    def on_micro_step_start(self, event: TrainerEvent, *, recovering: bool = False) -> Plan[TrainerReply]:
        """Deactivate the hybrids if they hold the trainer's GPUs; the answer is GPUS_READY."""
        core = self.core
        if recovering and core.mode is Mode.DEACTIVATING:
            commands = core.recovery_commands()
        else:
            commands = core.begin_micro_step(event.global_steps)
        yield Checkpoint()
        report = yield from self.execute(commands)
        if core.mode is Mode.DEACTIVATING:
            core.finish_deactivate(report.switch_s)
            self.serving_hybrids = ()
            yield Audit(event=AuditRecord(kind=AuditKind.SWITCH, activated=False, duration_s=report.switch_s,
                                          version=event.version, detail="deactivated"))
        return TrainerReply(action=TrainerAction.GPUS_READY, global_steps=event.global_steps,
                            wait_for_enough_samples_s=report.wait_for_enough_samples_s,
                            deactivate_s=report.switch_s)

    def on_collected(self, event: TrainerEvent) -> None:
        self.core.record_collection(wait_time_s=event.wait_time_s, wait_samples=event.wait_samples)

    def on_weights_ready(self, event: TrainerEvent, *, recovering: bool = False) -> Plan[TrainerReply]:
        """Sync every serving replica to the new version, activating hybrids if the policy says so."""
        core = self.core
        if recovering and core.in_sync:
            commands = core.recovery_commands()
        else:
            progress: RolloutProgress = yield ReadProgress()
            commands = core.begin_sync(global_steps=event.global_steps, version=event.version,
                                       total_generated_samples=progress.total_generated,
                                       completed_steps=progress.completed_steps)
        yield Checkpoint()
        activating = core.mode is Mode.ACTIVATING
        report = yield from self.execute(commands, weights_path=event.weights_path,
                                         release_trainer=activating and bool(core.hybrid_ids))
        if activating:
            core.finish_activate(report.switch_s)
            yield Audit(event=AuditRecord(kind=AuditKind.SWITCH, activated=True, duration_s=report.switch_s,
                                          version=event.version, detail="activated"))
        core.finish_sync(event.global_steps)
        report.activated = activating
        self.last_report = report
        return TrainerReply(action=TrainerAction.SYNC_DONE, global_steps=event.global_steps,
                            activated=activating, param_sync_s=report.standalone_sync_s + report.switch_s)

    # ---- the commands ----

    def execute(self, commands: list[cc.Command], *, weights_path: str = "",
                release_trainer: bool = False) -> Plan[ExecutionReport]:
        """Run `commands` in order, timing each; the trainer is released before the first wake."""
        report = ExecutionReport()
        for command in commands:
            started = self.clock()
            if isinstance(command, cc.WakeReplicas) and release_trainer:
                release_trainer = False
                yield ReleaseTrainer()
                report.trainer_release_s += self.clock() - started
                started = self.clock()
            yield from self._apply(command, report, weights_path)
            elapsed = self.clock() - started
            if isinstance(command, cc.WaitForSamples):
                report.wait_for_enough_samples_s += elapsed
            elif isinstance(command, cc.SyncWeights) and command.replica_ids == self.core.standalone_ids:
                report.standalone_sync_s += elapsed
            elif not isinstance(command, cc.ResetStaleness):
                report.switch_s += elapsed
            replica_ids: tuple[str, ...] = getattr(command, "replica_ids", ())
            yield Audit(event=AuditRecord(kind=AuditKind.COMMAND, command=command.kind,
                                          replica_ids=replica_ids, duration_s=elapsed,
                                          version=getattr(command, "version", -1),
                                          detail=f"{command.kind} {getattr(command, 'replica_ids', '')} "
                                                 f"{elapsed:.3f}s"))
        return report

    def _apply(self, command: cc.Command, report: ExecutionReport, weights_path: str) -> Plan[None]:
        if isinstance(command, cc.WaitForSamples):
            yield AwaitSamples(min_queue_size=command.min_queue_size)
        elif isinstance(command, cc.RemoveReplicas | cc.AddReplicas):
            members: tuple[str, ...] = yield SetMembers(replica_ids=command.replica_ids,
                                                        add=isinstance(command, cc.AddReplicas))
            self.serving_hybrids = tuple(m for m in members if m not in self.core.standalone_ids)
            yield SetActiveReplicas(num_replicas=len(members))
        elif isinstance(command, cc.AbortReplicas | cc.SleepReplicas | cc.WakeReplicas | cc.ResumeReplicas):
            yield WorkerCall(replica_ids=command.replica_ids, action=_WORKER_ACTIONS[type(command)])
        elif isinstance(command, cc.SyncWeights):
            yield from self._sync(command, report, weights_path)
        elif isinstance(command, cc.Rebalance):
            # Clear sticky sessions, abort and resume every serving replica, so the retried requests
            # spread least-loaded onto the newly added (empty) hybrids. No drain poll between abort
            # and resume: the load balancer releases a slot before the result reaches the rollouter.
            serving = self.core.standalone_ids + self.serving_hybrids
            yield ClearSticky()
            yield WorkerCall(replica_ids=serving, action=CommandAction.ABORT)
            yield WorkerCall(replica_ids=serving, action=CommandAction.RESUME)
        elif isinstance(command, cc.ResetStaleness):
            report.rollouter_report = yield ResetRollouter(version=command.version)
        else:  # pragma: no cover - a new command kind needs a branch here
            raise AssertionError(f"unhandled command {command!r}")

    def _sync(self, command: cc.SyncWeights, report: ExecutionReport, weights_path: str) -> Plan[None]:
        result: WeightSyncReport = yield SyncReplicas(
            replica_ids=command.replica_ids, version=command.version, weights_path=weights_path)
        if not result.pushed:
            return
        # One push per group (ipc: per replica); a report without them is one push of them all.
        pushes = result.pushes or [PushGroupReport(replica_ids=list(command.replica_ids), ok=result.ok,
                                                   error=result.error, push_s=result.push_s)]
        for push in pushes:
            report.pushes += 1
            report.push_fallbacks += not push.ok
            outcome = "ok" if push.ok else f"failed: {push.error}"
            yield Audit(event=AuditRecord(
                kind=AuditKind.PUSH, transport=result.transport, replica_ids=tuple(push.replica_ids),
                ok=push.ok, error=push.error, duration_s=push.push_s, version=command.version,
                detail=f"{result.transport} {push.replica_ids} {outcome} {push.push_s:.3f}s"))


def drive(plan: Plan[T], perform: Callable[[Op], Any]) -> T:
    """Run a plan with a synchronous `perform` (tests, and drivers that need no waiting)."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result = perform(op)
