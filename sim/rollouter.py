"""The simulated rollouter: prompt feed, flow control, routing, partial-rollout retries, MessageQueue.

Where it sits: between the trainer process (``sim.run``), which pops samples
from ``mq`` and tells it about replica changes and weight versions, and the
``Replica`` timing models (``sim.model``). The decisions are the services'
pure code, not copies: flow limits and staleness come from ``core.flow``,
routing from ``core.routing``. What remains here is the event plumbing.

Processor semantics (reference 1.1): before popping a sample, latch ``paused``
if the pause condition holds; a popped sample counts toward staleness at once
and then waits for a concurrency slot. Only the monitor (every
``monitor_interval_s``) or a weight-sync reset un-pauses. When the queue is
full, the oldest queued sample is evicted and counted as dropped.
"""

from __future__ import annotations

from collections import deque

from core.flow import FlowLimits, StalenessTracker
from core.metrics import UtilizationHistory
from core.routing import LoadBalancerState, NoReplicaAvailable
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
        self.tracker = StalenessTracker(limits=limits, now_s=0.0)
        self.lb = LoadBalancerState()
        self.replicas: dict[str, Replica] = {}
        self.mq: deque[Sample] = deque()
        self.mq_changed = engine.signal("mq_changed")
        self.version = 0
        self.started = False
        self.max_concurrent = 0
        self.active_samples = 0
        self._held: Sample | None = None
        self._next_index = 0
        self._monitor_armed = False
        self.util = UtilizationHistory(t0=0.0)
        """(time, active samples, capacity) since the last reset (section 4.2)."""
        self.mq_peak = 0
        """Largest queue size since the last reset."""
        self.fed = 0
        self.dropped = 0
        self.retries = 0
        self.idle_since_s: float | None = None

    # -- replica membership ----------------------------------------------------

    def add_replica(self, replica: Replica) -> None:
        self.replicas[replica.replica_id] = replica

    def on_replicas_changed(self) -> None:
        """Recompute max_concurrent after the LB membership changed (add/remove)."""
        self.max_concurrent = self.limits.max_concurrent(len(self.lb.replica_ids), self.cfg.concurrent_samples_per_replica)
        self._note_util()
        self.try_submit()

    def _note_util(self) -> None:
        self.util.record(self.engine.now_s, self.active_samples, self.max_concurrent)

    # -- processor -------------------------------------------------------------

    def start(self) -> None:
        self.started = True
        self.try_submit()

    def try_submit(self) -> None:
        """Run the processor until it blocks: paused, no slot, or feed exhausted."""
        if not self.started:
            return
        tracker = self.tracker
        while True:
            if self._held is None:
                if tracker.check_pause(len(self.mq)):
                    self._arm_monitor()
                    self._maybe_idle()
                    return
                if self._next_index >= self.limits.total_rollout_steps:
                    return
                self._held = Sample(self._next_index, self.cfg.n, self.engine.now_s)
                self._next_index += 1
                self.fed += 1
                tracker.on_submit()
            if self.active_samples >= self.max_concurrent:
                return
            sample, self._held = self._held, None
            self._spawn(sample)

    def _maybe_idle(self) -> None:
        if self.active_samples == 0 and self.idle_since_s is None:
            self.idle_since_s = self.engine.now_s
            self.tracker.on_idle_start(self.engine.now_s)

    def _arm_monitor(self) -> None:
        if self._monitor_armed:
            return
        self._monitor_armed = True
        period = self.scenario.costs.monitor_interval_s
        next_tick = (int(self.engine.now_s / period) + 1) * period
        self.engine.at(next_tick, self._monitor_tick)

    def _monitor_tick(self) -> None:
        self._monitor_armed = False
        if self.tracker.try_resume(len(self.mq)):
            self._end_idle()
            self.try_submit()
        elif self.tracker.paused:
            self._arm_monitor()

    def _end_idle(self) -> None:
        if self.idle_since_s is not None:
            self.tracker.on_idle_end(self.engine.now_s)
            self.idle_since_s = None

    def _spawn(self, sample: Sample) -> None:
        self.active_samples += 1
        self._note_util()
        k = sample.index
        prompt = self.workload.prompt[k]
        for j, target in enumerate(self.workload.response[k]):
            self._route(Request(f"s{k}_{j}", sample, prompt, target))

    def _route(self, req: Request) -> None:
        try:
            replica_id = self.lb.acquire(req.request_id)
        except NoReplicaAvailable:
            # only_hybrid with every hybrid asleep: the client retries every second.
            self.engine.after(self.scenario.replica.retry_delay_s, self._route, req)
            return
        self.replicas[replica_id].submit(req)

    # -- completions, aborts ---------------------------------------------------

    def on_finish(self, replica: Replica, req: Request) -> None:
        self.lb.release(replica.replica_id)
        self.lb.forget(req.request_id)
        sample = req.sample
        sample.pending -= 1
        if sample.pending:
            return
        sample.finished_s = self.engine.now_s
        self.active_samples -= 1
        if len(self.mq) >= self.limits.max_queue_size:
            self.mq.popleft()
            self.dropped += 1
            self.tracker.on_dropped()
        else:
            self.tracker.on_generated()
        self.mq.append(sample)
        self.mq_peak = max(self.mq_peak, len(self.mq))
        self._note_util()
        self.mq_changed.fire()
        self.try_submit()
        if self.tracker.paused:
            self._maybe_idle()

    def abort(self, replica_ids: tuple[str, ...]) -> int:
        """Abort the replicas' in-flight attempts; each retries after the client back-off."""
        num_aborted = 0
        delay_s = self.scenario.replica.retry_delay_s
        for replica_id in replica_ids:
            replica = self.replicas[replica_id]
            for req in replica.abort_all():
                self.lb.release(replica_id)
                self.engine.after(delay_s, self._route, req)
                num_aborted += 1
        self.retries += num_aborted
        return num_aborted

    # -- weight versions -------------------------------------------------------

    def reset(self, version: int) -> dict[str, float]:
        """``reset_staleness`` at a sync; returns the rollouter's per-version metrics."""
        now = self.engine.now_s
        self.version = version
        self._end_idle()
        rollout_util = self.util.close(now)
        report = self.tracker.reset(num_active=self.active_samples, queue_size=len(self.mq), now_s=now)
        mq_peak, self.mq_peak = self.mq_peak, len(self.mq)
        self.try_submit()
        return {
            "sim/mq_peak": float(mq_peak),
            "dynamic_resource/rollout_resource_utilization": rollout_util,
            "fully_async/rollouter/step_generated_samples": float(report.step_generated_samples),
            "fully_async/rollouter/idle_ratio": report.idle_ratio,
            "fully_async/rollouter/version_time": report.version_time_s,
        }

    # -- accounting ------------------------------------------------------------

    def generating(self) -> int:
        """Samples taken from the feed and not yet queued (in flight, or held for a slot)."""
        return self.active_samples + (self._held is not None)

