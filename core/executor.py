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

    on_micro_step_start -> Checkpoint, [AwaitSamples, ReadProgress, SetMembers(remove),
                           WorkerCall(abort), WorkerCall(sleep)] -> finish_deactivate -> GPUS_READY
    on_collected        -> record_collection
    on_weights_ready    -> ReadProgress, Checkpoint, [SyncReplicas(standalones),
                           ReleaseTrainer, WorkerCall(wake), SyncReplicas(hybrids), SetMembers(add),
                           WorkerCall(resume), rebalance, ResetRollouter] -> finish_activate,
                           finish_sync -> SYNC_DONE

The trainer's offload (ReleaseTrainer) runs just before the hybrids wake, after the
standalone sync, so a push to the standalones reads GPU-resident weights. With the core's
`fold_hybrid_sync` the wake comes first and one SyncReplicas covers every replica; with
`overlap_wake` the offload and the wake are one `Concurrently` op. The trainer onloads after
GPUS_READY (its AcquireGpu); with `overlap_sleep` the onload and the hybrids' sleep are one
`Concurrently` op before it, so the deactivation's time holds both.

Measurements: every ReadProgress (at a sync, and when a hybrid window closes), every change
of who serves, and the arrival times of the trainer's handshakes feed `core.measure.RateMeter`;
the core puts its rates in the policy's context before each decision, and a policy that
explains its decision (`explain_last_decision`) is audited before its commands run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core import controller as cc
from core import metrics as M
from core.controller import ControllerCore, Mode
from core.executor_ops import (  # noqa: F401  (re-exported: drivers and tests use core.executor's names)
    AcquireTrainer,
    Audit,
    AuditRecord,
    AwaitSamples,
    Checkpoint,
    ClearSticky,
    Concurrently,
    Op,
    ReadProgress,
    ReleaseTrainer,
    ResetRollouter,
    RolloutProgress,
    SetActiveReplicas,
    SetMembers,
    SyncReplicas,
    WorkerCall,
)
from core.measure import RateMeter
from shared.schema import (
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
    decode_load_cost: float = 0.0
    """The engines' load cost the controller measured, with that report (core/measure.py)."""

    def cycle_metrics(self) -> dict[str, float]:
        """The sync's contribution to its cycle's metrics (the rollouter's report included)."""
        return {
            **{k: float(v) for k, v in self.rollouter_report.items()},
            M.DECODE_LOAD_COST: self.decode_load_cost,
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

    def __init__(self, *, core: ControllerCore, clock: Callable[[], float],
                 overlap_wake: bool = False, overlap_sleep: bool = False) -> None:
        self.core = core
        self.clock = clock
        self.overlap_wake = overlap_wake
        """The trainer's offload and the hybrids' wake run concurrently (config: where memory allows)."""
        self.overlap_sleep = overlap_sleep
        """The trainer's onload and the hybrids' sleep run concurrently (config: where memory allows)."""
        self.serving_hybrids: tuple[str, ...] = core.hybrid_ids if core.mode is Mode.HYBRID_ACTIVE else ()
        """Hybrids the load balancer routes to (from its last membership answer)."""
        self.meter = RateMeter(num_standalone=len(core.standalone_ids), num_hybrid=len(core.hybrid_ids),
                               hybrids_serving=len(self.serving_hybrids))
        """What the policy's measured context fields come from (core.measure)."""
        self._collected_at: float | None = None
        self._ready_at: float | None = None
        """When the last GPUS_READY that followed a deactivation was sent (None: no deactivation)."""
        self.last_report = ExecutionReport()
        """The report of the last weights_ready handled (its cycle's sync metrics)."""

    # ---- handshakes ----

    def on_micro_step_start(self, event: TrainerEvent, *, recovering: bool = False) -> Plan[TrainerReply]:
        """Deactivate the hybrids if they hold the trainer's GPUs; the answer is GPUS_READY."""
        core = self.core
        self._measure_micro_step()
        if recovering and core.mode is Mode.DEACTIVATING:
            commands = core.recovery_commands()
        else:
            commands = core.begin_micro_step(event.global_steps)
        yield Checkpoint()
        if commands:
            yield from self._explain(event.version)
        report = yield from self.execute(commands)
        self._ready_at = None
        if core.mode is Mode.DEACTIVATING:
            core.finish_deactivate(report.switch_s, wait_s=report.wait_for_enough_samples_s)
            self.serving_hybrids = ()
            yield Audit(event=AuditRecord(kind=AuditKind.SWITCH, activated=False, duration_s=report.switch_s,
                                          version=event.version, detail="deactivated"))
            self._ready_at = self.clock()
        return TrainerReply(action=TrainerAction.GPUS_READY, global_steps=event.global_steps,
                            wait_for_enough_samples_s=report.wait_for_enough_samples_s,
                            deactivate_s=report.switch_s)

    def on_collected(self, event: TrainerEvent) -> None:
        now = self.clock()
        self.core.record_collection(wait_time_s=event.wait_time_s, wait_samples=event.wait_samples)
        if self._ready_at is not None:  # the trainer's onload after the hybrids slept (its acquire)
            self.core.record_switch_overhead(max(0.0, now - self._ready_at - event.wait_time_s))
            self._ready_at = None
        self._collected_at = now

    def _measure_micro_step(self) -> None:
        """A trainer handshake arrived: the micro-step collected last is done; refresh the context."""
        if self._collected_at is not None:
            self.meter.record_micro_step(self.clock() - self._collected_at)
            self._collected_at = None
        m = self.meter
        self.core.record_measurements(standalone_samples_per_replica_s=m.standalone_samples_per_replica_s,
                                      hybrid_samples_per_replica_s=m.hybrid_samples_per_replica_s,
                                      samples_per_replica_s=m.samples_per_replica_s,
                                      static_samples_per_replica_s=m.static_samples_per_replica_s,
                                      hybrid_window_samples_per_s=m.hybrid_window_samples_per_s,
                                      last_hybrid_window_samples_per_s=m.last_hybrid_window_samples_per_s,
                                      trainer_s_per_micro_step=m.trainer_s_per_micro_step,
                                      decode_load_cost=m.decode_load_cost,
                                      handover_on_time_share=m.handover_on_time_share)

    def _explain(self, version: int) -> Plan[None]:
        """Audit the numbers behind the policy's decision, when the policy gives them."""
        decision = self.core.policy.explain_last_decision()
        if decision:
            plain = json.loads(json.dumps(decision, default=str))  # wire-safe: numbers, strings, dicts
            yield Audit(event=AuditRecord(kind=AuditKind.DECISION, version=version, decision=plain,
                                          detail=f"policy {plain.get('decision', '')}"))

    def on_weights_ready(self, event: TrainerEvent, *, recovering: bool = False) -> Plan[TrainerReply]:
        """Sync every serving replica to the new version, activating hybrids if the policy says so."""
        core = self.core
        if recovering and core.in_sync:
            commands = core.recovery_commands()
        else:
            progress: RolloutProgress = yield ReadProgress()
            self.meter.read_progress(self.clock(), progress.total_generated, cycle_end=True,
                                     idle_s=progress.idle_s, cut_samples=progress.cut_samples)
            self.meter.record_handover(handed_over=progress.handed_over, on_time=progress.handed_over_on_time)
            self._measure_micro_step()
            commands = core.begin_sync(global_steps=event.global_steps, version=event.version,
                                       total_generated_samples=progress.total_generated,
                                       completed_steps=progress.completed_steps,
                                       queue_size=progress.queue_size, feed_done=progress.feed_done,
                                       generating_samples=progress.generating)
            yield from self._explain(event.version)
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
        meter, standalones = self.meter, self.core.standalone_ids
        for command in commands:
            if isinstance(command, cc.RemoveReplicas):  # the hybrids' window closes: measure it
                progress: RolloutProgress = yield ReadProgress()
                # One instant for both: a live clock moves between two reads, and the sliver of hybrid
                # time it would leave made the whole next cycle count as a (near-zero-length) window.
                closed = self.clock()
                meter.read_progress(closed, progress.total_generated, idle_s=progress.idle_s,
                                    cut_samples=progress.cut_samples)
                meter.set_serving(closed, hybrids=0)
            started = self.clock()
            standalone_sync = (isinstance(command, cc.SyncWeights) and bool(standalones)
                               and set(standalones) <= set(command.replica_ids))
            if standalone_sync:
                meter.set_serving(started, standalones=0)
            if isinstance(command, cc.WakeReplicas) and release_trainer:
                release_trainer = False
                if self.overlap_wake:  # offload and wake at once: the whole of it is the switch's
                    yield Concurrently(ops=(ReleaseTrainer(), WorkerCall(
                        replica_ids=command.replica_ids, action=CommandAction.WAKE)))
                else:
                    yield ReleaseTrainer()
                    report.trainer_release_s += self.clock() - started
                    self.core.record_switch_overhead(self.clock() - started)
                    started = self.clock()
                    yield from self._apply(command, report, weights_path)
            elif isinstance(command, cc.SleepReplicas) and self.overlap_sleep:
                sleep = WorkerCall(replica_ids=command.replica_ids, action=CommandAction.SLEEP)
                yield Concurrently(ops=(sleep, AcquireTrainer()))
            else:
                yield from self._apply(command, report, weights_path)
            now = self.clock()
            elapsed = now - started
            if standalone_sync:
                meter.set_serving(now, standalones=len(standalones))
            elif isinstance(command, cc.ResumeReplicas):
                meter.set_serving(now, hybrids=len(self.serving_hybrids))
            if isinstance(command, cc.WaitForSamples):
                report.wait_for_enough_samples_s += elapsed
            elif standalone_sync:  # a folded sync is the one that happens anyway: not the switch's
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
            # every standalone counts, also one the LB holds out of routing as dead right now: it is back
            # when it beats again, and nothing would tell the rollouter then (a 0 here stopped its feed
            # for good after a Redis pause that expired every heartbeat at once)
            yield SetActiveReplicas(num_replicas=len(self.core.standalone_ids) + len(self.serving_hybrids))
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
            self.meter.record_decode_fit(report.rollouter_report or {})
            report.decode_load_cost = self.meter.decode_load_cost
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
            transport = push.transport or result.transport
            yield Audit(event=AuditRecord(
                kind=AuditKind.PUSH, transport=transport, replica_ids=tuple(push.replica_ids),
                ok=push.ok, error=push.error, duration_s=push.push_s, version=command.version,
                detail=f"{transport} {push.replica_ids} {outcome} {push.push_s:.3f}s"))


def drive(plan: Plan[T], perform: Callable[[Op], Any]) -> T:
    """Run a plan with a synchronous `perform` (tests, and drivers that need no waiting)."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result = perform(op)
