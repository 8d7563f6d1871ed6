"""The fully-async loop on a virtual clock, driven by the real controller core and policies.

Where it sits: top of the simulator. ``simulate(scenario)`` builds replicas
(``sim.model``), the rollouter (``sim.rollouter``, on ``core.flow`` and
``core.routing``), the policy (``policies.build_policy``) and the
``core.controller.ControllerCore``, then runs the trainer as one process whose
body follows the reference's micro-step order (section 1.3):

1. ``core.begin_micro_step`` -> execute [WaitForSamples, Remove, Abort, Sleep] in order.
2. Pop ``required`` samples from the MessageQueue (blocking); ``record_collection``.
3. Train (timing model).
4. Every ``trigger`` micro-steps: ``core.begin_sync`` -> execute [SyncWeights, Wake,
   SyncWeights, Add, Resume, Rebalance, ResetStaleness]; ``finish_activate``; ``finish_sync``.

The run ends when the trainer has produced ``total_train_steps`` versions.
"""

from __future__ import annotations

import time
from collections.abc import Generator

from core import controller as cc
from core.flow import FlowLimits
from policies import DynamicScheduleContext, build_policy
from sim.bound import ideal_lower_bound_s
from sim.engine import Engine, Signal
from sim.metrics import CycleMetrics
from sim.model import Replica, Sample, Workload
from sim.result import SimResult, Timeline
from sim.rollouter import SimRollouter
from sim.scenario import Scenario

Proc = Generator["float | Signal", None, None]


def flow_limits(scenario: Scenario) -> FlowLimits:
    cfg = scenario.async_training
    return FlowLimits(ppo_mini_batch_size=cfg.ppo_mini_batch_size, require_batches=cfg.require_batches,
                      trigger_parameter_sync_step=cfg.trigger_parameter_sync_step,
                      staleness_threshold=cfg.staleness_threshold, total_rollout_steps=cfg.total_rollout_steps)


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
        self.workload = Workload(scenario.workload, num_samples=cfg.total_rollout_steps, n=cfg.n, seed=scenario.seed)
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
        self.rollouter.on_replicas_changed()
        self.syncing: set[str] = set()
        self.trainer_phase = "idle"
        ctx = DynamicScheduleContext(required_samples=self.limits.required_samples,
                                     trigger_parameter_sync_step=self.limits.trigger_parameter_sync_step,
                                     only_hybrid=not self.standalone_ids,
                                     staleness_threshold=cfg.staleness_threshold)
        self.policy = build_policy(cfg.dynamic_schedule_policy, deactivate_ratio=cfg.dynamic_schedule_deactivate_ratio,
                                   only_hybrid=not self.standalone_ids)
        self.core = cc.ControllerCore(policy=self.policy, ctx=ctx, hybrid_ids=self.hybrid_ids,
                                      standalone_ids=self.standalone_ids,
                                      enable_rebalance=cfg.dynamic_schedule_enable_rebalance)
        self.metrics = CycleMetrics(train_gpus=cluster.train_gpus, rollout_gpus=cluster.rollout_gpus,
                                    dynamic=self.dynamic)
        self.result = SimResult(scenario=scenario.name, policy=cfg.dynamic_schedule_policy,
                                train_gpus=cluster.train_gpus, rollout_gpus=cluster.rollout_gpus,
                                dynamic=self.dynamic, gpus_per_lane=cluster.gpus_per_replica)
        self.trained = 0
        self.trained_tokens = 0.0
        self.version = 0

    # -- lanes ------------------------------------------------------------------

    def _on_busy(self, replica: Replica, busy: bool) -> None:
        if replica.hybrid:
            self._refresh_trainer_lanes()
        elif replica.replica_id not in self.syncing:
            self.timeline.set(self.standalone_lanes[replica.replica_id], "rollout" if busy else "idle",
                              self.engine.now_s)

    def _set_phase(self, phase: str) -> None:
        self.trainer_phase = phase
        self._refresh_trainer_lanes()

    def _refresh_trainer_lanes(self) -> None:
        now = self.engine.now_s
        for i, lane in enumerate(self.trainer_lanes):
            state = self.trainer_phase
            if state == "idle" and i < len(self.hybrid_ids):
                replica = self.rollouter.replicas[self.hybrid_ids[i]]
                if replica.awake and replica.num_inflight and not replica.paused:
                    state = "rollout"
            self.timeline.set(lane, state, now)

    # -- command execution -----------------------------------------------------

    def _execute(self, command: cc.Command, record: dict[str, float]) -> Proc:
        """Carry out one controller command on the virtual clock (a sub-process)."""
        r = self.rollouter
        if isinstance(command, cc.WaitForSamples):
            t0 = self.engine.now_s
            while len(r.mq) < command.min_queue_size:
                yield r.mq_changed
            record["wait_for_enough_samples"] += self.engine.now_s - t0
        elif isinstance(command, cc.SleepReplicas):
            self._set_phase("switch")
            yield self.scenario.costs.hybrid_sleep_s
            for rid in command.replica_ids:
                r.replicas[rid].sleep()
            self._set_phase("idle")
        elif isinstance(command, cc.SyncWeights):
            yield from self._sync_weights(command)
        elif isinstance(command, cc.Rebalance):
            yield from self._rebalance()
        elif isinstance(command, cc.ResetStaleness):
            record.update(r.reset(command.version))
        else:
            self._execute_instant(command)

    def _execute_instant(self, command: cc.Command) -> None:
        """Commands that take no virtual time: LB membership, abort, wake, resume."""
        r = self.rollouter
        if isinstance(command, cc.RemoveReplicas):
            r.lb.remove_replicas(command.replica_ids)
            r.on_replicas_changed()
        elif isinstance(command, cc.AbortReplicas):
            r.abort(command.replica_ids)
        elif isinstance(command, cc.WakeReplicas):
            for rid in command.replica_ids:
                r.replicas[rid].wake()
        elif isinstance(command, cc.AddReplicas):
            r.lb.add_replicas(command.replica_ids)
            r.on_replicas_changed()
        elif isinstance(command, cc.ResumeReplicas):
            for rid in command.replica_ids:
                r.replicas[rid].resume()
            r.try_submit()
        else:  # pragma: no cover - a new command kind needs a branch here
            raise AssertionError(f"unhandled command {command!r}")

    def _sync_weights(self, command: cc.SyncWeights) -> Proc:
        r = self.rollouter
        hybrid = command.replica_ids[0] in self.hybrid_ids
        replicas = [r.replicas[rid] for rid in command.replica_ids]
        awake = [rep for rep in replicas if rep.awake and (not rep.hybrid or rep.replica_id in r.lb.inflight)]
        r.abort(tuple(rep.replica_id for rep in awake))
        for rep in awake:
            rep.pause()
        if hybrid:
            self._set_phase("switch")
            yield self.scenario.costs.hybrid_sync_s
        else:
            self.syncing.update(command.replica_ids)
            for rid in command.replica_ids:
                self.timeline.set(self.standalone_lanes[rid], "sync", self.engine.now_s)
            self._set_phase("sync")
            yield self.scenario.costs.standalone_sync_s
            self.syncing.difference_update(command.replica_ids)
        for rep in replicas:
            rep.version = command.version
        for rep in awake:
            rep.resume()
        self._set_phase("idle")
        for rep in replicas:
            self._on_busy(rep, bool(rep.num_inflight) and not rep.paused)

    def _rebalance(self) -> Proc:
        r = self.rollouter
        r.lb.clear_sticky()
        active = tuple(r.lb.replica_ids)
        r.abort(active)
        for rid in active:
            r.replicas[rid].pause()
        yield self.scenario.costs.rebalance_poll_s
        for rid in active:
            r.replicas[rid].resume()

    # -- the trainer -------------------------------------------------------------

    def _sync(self, global_steps: int, record: dict[str, float]) -> Proc:
        commands = self.core.begin_sync(global_steps=global_steps, version=self.version,
                                        total_generated_samples=self.rollouter.tracker.total_generated,
                                        completed_steps=self.rollouter.tracker.completed_steps)
        activating = self.core.mode is cc.Mode.ACTIVATING
        t_act = None
        for command in commands:
            if isinstance(command, cc.WakeReplicas):
                t_act = self.engine.now_s
            if isinstance(command, cc.ResetStaleness) and t_act is not None:
                self.core.finish_activate(self.engine.now_s - t_act)
                t_act = None
            yield from self._execute(command, record)
        if activating and self.core.mode is cc.Mode.ACTIVATING:
            self.core.finish_activate(self.engine.now_s - t_act if t_act is not None else 0.0)
        record["activated"] = float(activating)
        self.core.finish_sync(global_steps)

    def _train_time_s(self, batch: list[Sample]) -> float:
        tcfg = self.scenario.trainer
        tokens = sum(self.workload.sample_tokens(s.index) for s in batch)
        self.trained_tokens += tokens
        units = self.scenario.cluster.train_gpus // self.scenario.cluster.trainer_unit_gpus
        return tcfg.fixed_s_per_micro_step + tokens / 1000.0 * tcfg.seconds_per_ktoken / tcfg.speedup(units)

    def _trainer(self) -> Proc:
        r = self.rollouter
        engine = self.engine
        required = self.limits.required_samples
        trigger = self.limits.trigger_parameter_sync_step
        init_record = self.metrics.new_record()
        yield from self._sync(0, init_record)
        r.start()
        for global_steps in range(1, self.limits.total_train_steps * trigger + 1):
            rec = self.metrics.new_record()
            t_step = engine.now_s
            commands = self.core.begin_micro_step(global_steps)
            t_deact = None
            for command in commands:
                if isinstance(command, cc.RemoveReplicas):
                    t_deact = engine.now_s
                yield from self._execute(command, rec)
            if commands:
                self.core.finish_deactivate(engine.now_s - t_deact if t_deact is not None else 0.0)
                rec["deactivate"] = engine.now_s - t_deact if t_deact is not None else 0.0
            t_alloc = engine.now_s
            wait_samples = max(0, required - len(r.mq))
            batch: list[Sample] = []
            while len(batch) < required:
                while not r.mq:
                    yield r.mq_changed
                batch.append(r.mq.popleft())
            if self.scenario.trainer.collect_s:  # model hook: fetch + assemble the batch (sim.physics docs)
                yield self.scenario.trainer.collect_s
            rec["gen"] = engine.now_s - t_alloc
            self.core.record_collection(wait_time_s=rec["gen"], wait_samples=wait_samples)
            compute_s = self._train_time_s(batch)
            self._set_phase("train")
            yield compute_s
            self._set_phase("idle")
            self.trained += len(batch)
            rec["compute"] = compute_s
            if global_steps % trigger == 0:
                self.version += 1
                t_sync = engine.now_s
                yield from self._sync(global_steps, rec)
                rec["param_sync"] = engine.now_s - t_sync
            rec["alloc"] = engine.now_s - t_alloc
            rec["step"] = engine.now_s - t_step
            self.result.mq_series.append((engine.now_s, len(r.mq)))
            rec["mq_size"] = float(len(r.mq))
            self.metrics.add_micro_step(rec)
            if global_steps % trigger == 0:
                ratio = getattr(self.policy, "deactivate_ratio", float("nan"))
                self.result.cycles.append(self.metrics.close_cycle(
                    version=self.version, now_s=engine.now_s, deactivate_ratio=float(ratio)))
        engine.stop()

    # -- entry -------------------------------------------------------------------

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.engine.start_process(self._trainer())
        self.engine.run(max_time_s=1e9)
        if self.version < self.limits.total_train_steps:
            raise RuntimeError(f"simulation stalled at t={self.engine.now_s:.1f}s, version {self.version}: "
                               f"no pending event (trainer waiting, nothing generating)")
        res = self.result
        r = self.rollouter
        res.wall_s = self.engine.now_s
        res.ideal_bound_s = ideal_lower_bound_s(self.scenario, self.workload)
        res.activations = self.core.activations
        res.deactivations = self.core.deactivations
        res.versions = self.version
        res.micro_steps = self.version * self.limits.trigger_parameter_sync_step
        res.samples = {"fed": r.fed, "generating": r.generating(), "queued": len(r.mq), "trained": self.trained,
                       "dropped": r.dropped, "retried_attempts": r.retries}
        res.tokens = {"trained": self.trained_tokens,
                      "decoded": sum(rep.tokens_decoded for rep in r.replicas.values()),
                      "prefilled": sum(rep.tokens_prefilled for rep in r.replicas.values())}
        res.timeline = self.timeline
        res.events_processed = self.engine.events_processed
        res.runtime_s = time.perf_counter() - t0
        return res


def simulate(scenario: Scenario) -> SimResult:
    """Run one scenario to the end of training and return what happened."""
    return Simulation(scenario).run()
