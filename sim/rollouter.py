"""The rollouter on the virtual clock: the services' sample lifecycle driven by simulated replicas.

Where it sits: between the trainer (``sim.run``), which pops samples from ``mq``,
and the ``Replica`` timing models (``sim.model``). Every decision is the services'
pure code, not a copy: feed, pause latch, concurrency, monitor, enqueue and reset are
``core.sample_lifecycle.SampleLifecycle``; routing is ``core.routing``. What remains
here is the event plumbing: requests to replicas, the monitor's ticks every
``costs.monitor_interval_s`` (the service's period in modelled seconds) while the feed is paused,
retries after the client back-off.
Like the services, the MessageQueue never drops: it is bounded by the feed's pause.
"""

from __future__ import annotations

from collections import deque

from core.flow import FlowLimits
from core.routing import LoadBalancerState, NoReplicaAvailable
from core.sample_lifecycle import SampleLifecycle, sample_id_at, sample_index
from sim.engine import Engine
from sim.model import Replica, Request, Sample, Workload
from sim.scenario import Scenario


class SimRollouter:
    """Feeds samples, routes their trajectories, retries aborted ones, queues finished samples."""

    def __init__(self, engine: Engine, scenario: Scenario, workload: Workload, limits: FlowLimits) -> None:
        self.engine = engine
        self.scenario = scenario
        self.cfg = scenario.async_training
        self.workload = workload
        self.limits = limits
        self.lifecycle = SampleLifecycle(
            limits=limits, now_s=0.0, concurrent_samples_per_replica=self.cfg.concurrent_samples_per_replica,
            standalone_replicas=scenario.cluster.num_standalone,
            hybrid_concurrent_samples_per_replica=self.cfg.hybrid_concurrent_samples_per_replica,
            partial_rollout=self.cfg.partial_rollout)
        self.lb = LoadBalancerState()
        self.replicas: dict[str, Replica] = {}
        self.mq: deque[Sample] = deque()
        self.changed = engine.signal("rollouter_changed")
        """Fires when the queue grows or the feed's status changes (a wait for samples re-checks)."""
        self.started = False
        self._monitor_armed = False
        self.mq_peak = 0
        """Largest queue size since the last reset."""
        self.retries = 0

    def add_replica(self, replica: Replica) -> None:
        self.replicas[replica.replica_id] = replica

    def set_replicas(self, num_replicas: int) -> None:
        """The controller's set_active_replicas: recompute max_concurrent, maybe feed more."""
        self.lifecycle.set_replicas(num_replicas, self.engine.now_s)
        self.try_submit()

    # -- feed --------------------------------------------------------------------

    def start(self) -> None:
        self.started = True
        self.try_submit()

    def try_submit(self) -> None:
        """Feed until the lifecycle says stop: paused, no free slot, or feed exhausted."""
        if not self.started:
            return
        life = self.lifecycle
        while (sample_id := life.next_sample(mq_size=len(self.mq), now_s=self.engine.now_s)) is not None:
            self._spawn(Sample(sample_index(sample_id), self.cfg.n, self.engine.now_s))
        if self.lifecycle.tracker.paused:
            self._arm_monitor()
            self.changed.fire()

    def _arm_monitor(self) -> None:
        if self._monitor_armed:
            return
        self._monitor_armed = True
        self.engine.after(self.scenario.costs.monitor_interval_s, self._monitor_tick)

    def _monitor_tick(self) -> None:
        self._monitor_armed = False
        if self.lifecycle.monitor(mq_size=len(self.mq), now_s=self.engine.now_s):
            self.try_submit()
        elif self.lifecycle.tracker.paused:
            self._arm_monitor()
        self.changed.fire()

    def _spawn(self, sample: Sample) -> None:
        k = sample.index
        prompt = self.workload.prompt[k]
        for j, target in enumerate(self.workload.response[k]):
            self._route(Request(f"s{k}_{j}", sample, prompt, target))

    def _route(self, req: Request) -> None:
        try:
            replica_id = self.lb.acquire(req.request_id)
        except NoReplicaAvailable:
            # only_hybrid with every hybrid asleep: the client retries after its back-off.
            self.engine.after(self.scenario.replica.retry_delay_s, self._route, req)
            return
        self.replicas[replica_id].submit(req)

    # -- completions, aborts -------------------------------------------------------

    def on_finish(self, replica: Replica, req: Request) -> None:
        self.lifecycle.on_attempt_finished(tokens=req.decode_tokens, seconds=req.decode_s,
                                           inflight=req.mean_inflight, context=req.mean_context)
        self.lb.release(replica.replica_id)
        self._trajectory_done(req)

    def _trajectory_done(self, req: Request, *, cut: bool = False) -> None:
        """One trajectory finished (or was `cut` short by an abort): queue its sample once every trajectory
        is done."""
        self.lb.forget(req.request_id)
        sample = req.sample
        sample.pending -= 1
        if sample.pending:
            return
        sample.finished_s = self.engine.now_s
        self.mq.append(sample)
        self.lifecycle.on_enqueued(sample_id_at(sample.index), self.engine.now_s, cut=cut)
        self.mq_peak = max(self.mq_peak, len(self.mq))
        self.changed.fire()
        self.try_submit()

    def abort(self, replica_ids: tuple[str, ...]) -> int:
        """Abort the replicas' in-flight attempts; with partial rollout each retries after the client
        back-off, without it each trajectory ends at the tokens it has (`core.sample_progress`, as live)
        unless it has none yet. Returns the attempts to retry.
        An aborted replica holds new requests until resumed, as a live engine rejects them: a sample
        finished by the abort must not start its successor on a replica about to sync or sleep."""
        num_aborted = 0
        delay_s = self.scenario.replica.retry_delay_s
        for replica_id in replica_ids:
            replica = self.replicas[replica_id]
            replica.pause()
            for req in replica.abort_all():
                if replica.hybrid:
                    self.lifecycle.on_handed_over(sample_id_at(req.sample.index))
                self.lb.release(replica_id)
                if self.cfg.partial_rollout or req.generated < 1.0:  # no token yet: started again, as live
                    self.engine.after(delay_s, self._route, req)
                    num_aborted += 1
                else:
                    req.sample.cut_tokens += req.target_tokens - int(req.generated + 1e-6)
                    self._trajectory_done(req, cut=True)
        self.retries += num_aborted
        return num_aborted

    # -- weight versions -------------------------------------------------------------

    def reset(self, version: int) -> dict[str, float]:
        """``reset_staleness`` at a sync; returns the rollouter's per-version metrics."""
        report = self.lifecycle.reset(version=version, mq_size=len(self.mq), now_s=self.engine.now_s)
        report["sim/mq_peak"] = float(self.mq_peak)
        self.mq_peak = len(self.mq)
        self.try_submit()
        return report

    def pop(self) -> Sample:
        """The trainer takes the oldest queued sample."""
        return self.mq.popleft()

    # -- accounting ------------------------------------------------------------------

    @property
    def fed(self) -> int:
        return self.lifecycle.fed

    def generating(self) -> int:
        """Samples taken from the feed and not yet queued."""
        return len(self.lifecycle.active)
