"""The fully-async loop on a virtual clock, driven by the services' own orchestration objects.

Where it sits: top of the simulator. ``simulate(scenario)`` builds replicas
(``sim.model``), the rollouter (``sim.rollouter``, on ``core.sample_lifecycle``
and ``core.routing``), the policy and the ``core.controller.ControllerCore``.
Then it runs the trainer's cycle, ``core.trainer_cycle.TrainerCycle``, as one
process, answering each handshake with ``core.executor.ExecutorCore``: the very
objects the trainer and controller services drive over Redis. What is left here
is performing their operations on the clock with the GPU timing models:

- a trainer op (collect, train, ...) takes the time the trainer model says;
- an executor op (sleep, sync, LB membership, reset, ...) acts on the replica models.

The run ends when the trainer's cycle sends DONE.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Generator, Sequence
from typing import Any

from core import executor as ex
from core import trainer_cycle as tc
from core.build import build_controller_core, build_executor_core
from core.flow import FlowLimits
from core.metrics import DECODE_LOAD_COST
from shared.names import AccountingField as A
from shared.schema import AuditKind, CommandAction, TrainerEvent, TrainerPhase, WeightSyncReport
from shared.vocab import LaneState
from sim.bound import ideal_lower_bound_s
from sim.engine import Engine, Signal
from sim.metrics import CycleMetrics
from sim.model import Replica, Sample, Workload
from sim.result import SimResult, Timeline
from sim.rollouter import SimRollouter
from sim.scenario import Scenario

Proc = Generator["float | Signal", None, Any]


def flow_limits(scenario: Scenario) -> FlowLimits:
    cfg = scenario.async_training
    return FlowLimits(ppo_mini_batch_size=cfg.ppo_mini_batch_size, require_batches=cfg.require_batches,
                      trigger_parameter_sync_step=cfg.trigger_parameter_sync_step,
                      staleness_threshold=cfg.staleness_threshold,
                      total_rollout_steps=cfg.total_rollout_steps)


class Simulation:
    """One run: every component wired on one ``Engine``."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        cfg = scenario.async_training
        cluster = scenario.cluster
        self.engine = Engine()
        self.limits = flow_limits(scenario)
        if self.limits.total_train_steps < 1:
            raise ValueError(f"total_rollout_steps={cfg.total_rollout_steps} gives no full sync cycle")
        self.workload = Workload(scenario.workload, num_samples=cfg.total_rollout_steps, n=cfg.n,
                                 seed=scenario.seed)
        self.rollouter = SimRollouter(self.engine, scenario, self.workload, self.limits)
        self.dynamic = cfg.use_dynamic_resource_scheduling
        num_hybrid = cluster.num_hybrid if self.dynamic else 0
        if num_hybrid == 0 and cluster.num_standalone == 0:
            raise ValueError("no rollout capacity: rollout_gpus=0 needs use_dynamic_resource_scheduling")
        self.hybrid_ids = tuple(f"hybrid_{i}" for i in range(num_hybrid))
        self.standalone_ids = tuple(f"standalone_{j}" for j in range(cluster.num_standalone))
        self.trainer_lanes = [f"trainer_{i}" for i in range(cluster.train_gpus // cluster.gpus_per_replica)]
        self.standalone_lanes = {rid: f"rollout_{j}" for j, rid in enumerate(self.standalone_ids)}
        self.timeline = Timeline([*self.standalone_lanes.values(), *self.trainer_lanes])
        for rid in (*self.hybrid_ids, *self.standalone_ids):
            replica = Replica(self.engine, scenario.replica, replica_id=rid, hybrid=rid in self.hybrid_ids,
                              on_finish=self.rollouter.on_finish, on_busy=self._on_busy)
            self.rollouter.add_replica(replica)
        self.rollouter.lb.add_replicas(self.standalone_ids)
        self.rollouter.set_replicas(len(self.standalone_ids))  # the controller's announcement at start
        self.syncing: set[str] = set()
        self.trainer_phase = LaneState.IDLE
        self.trainer_on_gpu = True
        """False from the trainer's offload (ReleaseTrainer) to its onload (AcquireTrainer, AcquireGpu)."""
        engine_cap = scenario.config.rollout.max_num_seqs  # what the controller's config says, as live
        self.core = build_controller_core(cfg, required_samples=self.limits.required_samples,
                                          responses_per_sample=cfg.n,
                                          max_running_requests_per_replica=engine_cap,
                                          hybrid_ids=self.hybrid_ids, standalone_ids=self.standalone_ids,
                                          total_samples=self.limits.total_rollout_steps)
        self.policy = self.core.policy
        self.executor = build_executor_core(cfg, core=self.core, clock=self._now)
        self.cycle = tc.TrainerCycle(limits=self.limits, clock=self._now)
        self.metrics = CycleMetrics(train_gpus=cluster.train_gpus, rollout_gpus=cluster.rollout_gpus,
                                    dynamic=self.dynamic)
        self.result = SimResult(scenario=scenario.name, policy=cfg.dynamic_schedule_policy,
                                train_gpus=cluster.train_gpus, rollout_gpus=cluster.rollout_gpus,
                                dynamic=self.dynamic, gpus_per_lane=cluster.gpus_per_replica)
        self.trained = 0
        self.trained_tokens = 0.0
        self.trained_lag_versions: Counter[int] = Counter()
        """Trained samples per lag: the trainer's version minus the version of their first tokens."""

    def _now(self) -> float:
        return self.engine.now_s

    # -- lanes ------------------------------------------------------------------

    def _on_busy(self, replica: Replica, busy: bool) -> None:
        if replica.hybrid:
            self._refresh_trainer_lanes()
        elif replica.replica_id not in self.syncing:
            state = LaneState.ROLLOUT if busy else LaneState.IDLE
            self.timeline.set(self.standalone_lanes[replica.replica_id], state, self.engine.now_s)

    def _set_phase(self, phase: LaneState) -> None:
        self.trainer_phase = phase
        self._refresh_trainer_lanes()

    def _refresh_trainer_lanes(self) -> None:
        now = self.engine.now_s
        for i, lane in enumerate(self.trainer_lanes):
            state = self.trainer_phase
            if state is LaneState.IDLE and i < len(self.hybrid_ids):
                replica = self.rollouter.replicas[self.hybrid_ids[i]]
                if replica.awake and replica.num_inflight and not replica.paused:
                    state = LaneState.ROLLOUT
            self.timeline.set(lane, state, now)

    # -- the executor core's operations -------------------------------------------------

    def _run_plan(self, plan: ex.Plan[Any]) -> Proc:
        """Drive an ExecutorCore plan on the clock; returns the plan's value."""
        result: Any = None
        while True:
            try:
                op = plan.send(result)
            except StopIteration as done:
                return done.value
            result = yield from self._perform(op)

    def _perform(self, op: ex.Op) -> Proc:
        """Perform one of the plan's ops on the clock; returns its result. A policy decision's audit
        is kept in the result, as the live controller's audit stream keeps it."""
        if isinstance(op, ex.Audit) and op.event.kind is AuditKind.DECISION and op.event.decision:
            self.result.decisions.append({"version": op.event.version, **op.event.decision})
        return (yield from self._perform_one(op))

    def _perform_one(self, op: ex.Op) -> Proc:
        r = self.rollouter
        if isinstance(op, ex.AwaitSamples):
            while len(r.mq) < op.min_queue_size and not r.lifecycle.status().stalled:
                yield r.changed
        elif isinstance(op, ex.SetMembers):
            (r.lb.add_replicas if op.add else r.lb.remove_replicas)(op.replica_ids)
            return tuple(r.lb.replica_ids)
        elif isinstance(op, ex.SetActiveReplicas):
            r.set_replicas(op.num_replicas)
        elif isinstance(op, ex.WorkerCall):
            yield from self._worker_call(op)
        elif isinstance(op, ex.SyncReplicas):
            yield from self._sync_replicas(op)
            return WeightSyncReport(replica_ids=list(op.replica_ids), version=op.version)
        elif isinstance(op, ex.ClearSticky):
            r.lb.clear_sticky()
        elif isinstance(op, ex.ResetRollouter):
            return r.reset(op.version)
        elif isinstance(op, ex.ReadProgress):
            tracker, status = r.lifecycle.tracker, r.lifecycle.status()  # the status: what the live one reads
            return ex.RolloutProgress(total_generated=tracker.total_generated,
                                      completed_steps=tracker.completed_steps, queue_size=len(r.mq),
                                      cut_samples=r.lifecycle.cut_samples,
                                      feed_done=status.feed_done, generating=status.active_tasks,
                                      idle_s=status.idle_seconds(self._now()),
                                      handed_over=status.handed_over,
                                      handed_over_on_time=status.handed_over_on_time)
        elif isinstance(op, ex.ReleaseTrainer | ex.AcquireTrainer):
            yield from self._move_trainer(on_gpu=isinstance(op, ex.AcquireTrainer))
        elif isinstance(op, ex.Concurrently):
            return (yield from self._concurrently(op.ops))
        # Checkpoint, Audit: nothing to model (no crash, no log; a decision is kept by _perform)
        return None

    def _concurrently(self, ops: tuple[ex.Op, ...]) -> Proc:
        """Each op as its own process on the clock; done when the last one is."""
        done = self.engine.signal("concurrent_ops_done")
        results: list[Any] = [None] * len(ops)
        left = [len(ops)]

        def run_one(i: int, op: ex.Op) -> Proc:
            results[i] = yield from self._perform_one(op)  # parts of one op, not ops of the plan
            left[0] -= 1
            if not left[0]:
                done.fire()

        for i, op in enumerate(ops):
            self.engine.start_process(run_one(i, op))
        while left[0]:
            yield done
        return tuple(results)

    def _worker_call(self, op: ex.WorkerCall) -> Proc:
        r = self.rollouter
        replicas = [r.replicas[rid] for rid in op.replica_ids]
        if op.action is CommandAction.ABORT:
            r.abort(op.replica_ids)
        elif op.action is CommandAction.SLEEP:
            self._set_phase(LaneState.SWITCH)
            yield self.scenario.costs.hybrid_sleep_s
            for replica in replicas:
                replica.sleep()
            self._set_phase(LaneState.IDLE)
        elif op.action is CommandAction.WAKE:
            self._set_phase(LaneState.SWITCH)
            yield self.scenario.costs.hybrid_wake_s
            for replica in replicas:
                replica.wake()
            self._set_phase(LaneState.IDLE)
        elif op.action is CommandAction.RESUME:
            for replica in replicas:
                replica.resume()
            r.try_submit()
        else:  # pragma: no cover - a new worker action needs a branch here
            raise AssertionError(f"unhandled worker action {op.action}")

    def _sync_replicas(self, op: ex.SyncReplicas) -> Proc:
        r = self.rollouter
        hybrid = all(rid in self.hybrid_ids for rid in op.replica_ids)
        replicas = [r.replicas[rid] for rid in op.replica_ids]
        awake = [rep for rep in replicas if rep.awake and (not rep.hybrid or rep.replica_id in r.lb.inflight)]
        r.abort(tuple(rep.replica_id for rep in awake))  # which also pauses them until resumed
        costs = self.scenario.costs
        if hybrid:  # the in-process sync: hybrid_sync_s less the offload and wake modelled on their own
            self._set_phase(LaneState.SWITCH)
            yield max(0.0, costs.hybrid_sync_s - costs.trainer_offload_s - costs.hybrid_wake_s)
        else:  # standalones, or hybrids folded into the standalones' sync (both take weight_sync_s)
            standalone_ids = [rid for rid in op.replica_ids if rid in self.standalone_lanes]
            self.syncing.update(standalone_ids)
            for rid in standalone_ids:
                self.timeline.set(self.standalone_lanes[rid], LaneState.SYNC, self.engine.now_s)
            self._set_phase(LaneState.SYNC)
            yield costs.standalone_sync_s
            self.syncing.difference_update(standalone_ids)
        for rep in replicas:
            rep.version = op.version
        for rep in awake:
            rep.resume()
        self._set_phase(LaneState.IDLE)
        for rep in replicas:
            self._on_busy(rep, bool(rep.num_inflight) and not rep.paused)

    # -- the trainer cycle's operations ---------------------------------------------------

    def _trainer(self) -> Proc:
        plan = self.cycle.run()
        result: Any = None
        if self.scenario.trainer.validation_before_train_s:
            yield self.scenario.trainer.validation_before_train_s
        while True:
            try:
                op = plan.send(result)
            except StopIteration:
                return None
            result = yield from self._perform_trainer(op)

    def _perform_trainer(self, op: tc.TrainerOp) -> Proc:
        r = self.rollouter
        if isinstance(op, tc.Handshake):
            if op.event.phase is TrainerPhase.MICRO_STEP_START:
                return (yield from self._run_plan(self.executor.on_micro_step_start(op.event)))
            return (yield from self._run_plan(self.executor.on_weights_ready(op.event)))
        if isinstance(op, tc.Send):
            self._on_trainer_event(op.event)
            yield from self._validate_after(op.event)
        elif isinstance(op, tc.QueueSize):
            return len(r.mq)
        elif isinstance(op, tc.Collect):
            return (yield from self._collect(op.count))
        elif isinstance(op, tc.Train):  # the weights it trains are this version's (the sync comes after)
            self.trained_lag_versions.update(self.cycle.version - sample.min_version for sample in op.batch)
            compute_s = self._train_time_s(op.batch)
            self._set_phase(LaneState.TRAIN)
            yield compute_s
            self._set_phase(LaneState.IDLE)
            return tc.TrainResult(timings={"timing_s/update_actor": compute_s})
        elif isinstance(op, tc.MarkTrained):
            self.trained += len(op.batch)
        elif isinstance(op, tc.ExportWeights):
            return ""
        elif isinstance(op, tc.AcquireGpu):
            yield from self._move_trainer(on_gpu=True)
        # SaveCheckpoint, SaveProgress: nothing to model
        return None

    def _collect(self, count: int) -> Proc:
        r = self.rollouter
        batch: list[Sample] = []
        while len(batch) < count:
            while not r.mq:
                yield r.changed
            batch.append(r.pop())
        if self.scenario.trainer.collect_s:  # fetch + assemble the batch, inside timing_s/gen
            yield self.scenario.trainer.collect_s
        return batch

    def _move_trainer(self, *, on_gpu: bool) -> Proc:
        """The trainer offloads its state for the hybrids or onloads it back (the live backends'
        release_gpu / acquire_gpu): `trainer_offload_s` each way, nothing where it already is."""
        if self.trainer_on_gpu != on_gpu:
            self._set_phase(LaneState.SWITCH)
            yield self.scenario.costs.trainer_offload_s
            self.trainer_on_gpu = on_gpu
            self._set_phase(LaneState.IDLE)

    def _validate_after(self, event: TrainerEvent) -> Proc:
        """verl validates after the step timer of every ``test_freq``-th version: the trainer waits
        (wall time, not timing_s/step) while the rollouter keeps generating."""
        if event.phase is TrainerPhase.MICRO_STEP_DONE:
            validation_s = self.scenario.trainer.validation_after_s(
                global_steps=event.global_steps, version=event.version,
                trigger_parameter_sync_step=self.limits.trigger_parameter_sync_step)
            if validation_s:
                yield validation_s

    def _on_trainer_event(self, event: TrainerEvent) -> None:
        if event.phase is TrainerPhase.COLLECTED:
            self.executor.on_collected(event)
        elif event.phase is TrainerPhase.MICRO_STEP_DONE:
            self._close_micro_step(event)
        elif event.phase is TrainerPhase.DONE:
            self.engine.stop()

    def _close_micro_step(self, event: TrainerEvent) -> None:
        m = event.stats
        record = {"wait_for_enough_samples": m["timing_s/wait_for_enough_samples"],
                  "deactivate": m["timing_s/deactivate"], "gen": m["timing_s/gen"],
                  "compute": m["dynamic_resource/train_compute_time_s"],
                  "param_sync": m["timing_s/param_sync"],
                  "alloc": m["dynamic_resource/train_allocated_time_s"], "step": m["timing_s/step"],
                  "mq_size": m["dynamic_resource/mq_size"]}
        now = self.engine.now_s
        self.result.mq_series.append((now, len(self.rollouter.mq)))
        synced = event.global_steps % self.limits.trigger_parameter_sync_step == 0
        if synced:
            report = self.executor.last_report
            record.update(report.rollouter_report)
            record[DECODE_LOAD_COST] = report.decode_load_cost
            record["activated"] = float(report.activated)
        self.metrics.add_micro_step(record)
        if synced:
            ratio = getattr(self.policy, "deactivate_ratio", float("nan"))
            self.result.cycles.append(self.metrics.close_cycle(version=event.version, now_s=now,
                                                               deactivate_ratio=float(ratio)))

    def _train_time_s(self, batch: Sequence[Sample]) -> float:
        tokens = [self.workload.sample_tokens(s.index) - s.cut_tokens for s in batch]
        self.trained_tokens += sum(tokens)
        return self.scenario.trainer.micro_step_s(tokens)

    # -- entry -------------------------------------------------------------------

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.rollouter.start()
        self.engine.start_process(self._trainer())
        self.engine.run(max_time_s=1e9)
        if self.cycle.version < self.limits.total_train_steps:
            raise RuntimeError(f"simulation stalled at t={self.engine.now_s:.1f}s, "
                               f"version {self.cycle.version}: "
                               f"no pending event (trainer waiting, nothing generating)")
        res = self.result
        r = self.rollouter
        res.wall_s = self.engine.now_s
        res.ideal_bound_s = ideal_lower_bound_s(self.scenario, self.workload)
        res.activations = self.core.activations
        res.deactivations = self.core.deactivations
        res.versions = self.cycle.version
        res.micro_steps = self.cycle.version * self.limits.trigger_parameter_sync_step
        res.samples = {A.FED: r.fed, A.GENERATING: r.generating(), A.QUEUED: len(r.mq),
                       A.TRAINED: self.trained, A.DROPPED: 0, "retried_attempts": r.retries}
        res.tokens = {"trained": self.trained_tokens,
                      "decoded": sum(rep.tokens_decoded for rep in r.replicas.values()),
                      "prefilled": sum(rep.tokens_prefilled for rep in r.replicas.values())}
        res.sample_lag_versions = dict(sorted(self.trained_lag_versions.items()))
        res.timeline = self.timeline
        res.events_processed = self.engine.events_processed
        res.runtime_s = time.perf_counter() - t0
        return res


def simulate(scenario: Scenario) -> SimResult:
    """Run one scenario to the end of training and return what happened."""
    return Simulation(scenario).run()
