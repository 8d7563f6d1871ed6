"""Pure unit tests of the sans-I/O orchestration objects: core.executor, core.trainer_cycle,
core.sample_lifecycle (no Redis, no clock: every result and every time is given)."""

from __future__ import annotations

from typing import Any

import pytest

from core import executor as ex
from core import trainer_cycle as tc
from core.flow import FlowLimits
from core.measure import HANDED_OVER, HANDED_OVER_ON_TIME
from core.sample_lifecycle import RolloutStatus, SampleLifecycle
from shared.schema import (
    AuditKind,
    CommandAction,
    PushGroupReport,
    TrainerAction,
    TrainerEvent,
    TrainerPhase,
    TrainerReply,
)
from shared.schema import WeightSyncReport as Report
from tests.test_controller_core import H, S, SpyPolicy, make_core

# ---- core.executor -----------------------------------------------------------------------------


class Peers:
    """Answers ops like healthy peers would, and records them; `sync_reports` answers SyncReplicas."""

    def __init__(self, *, sync_reports: list[Report] | None = None) -> None:
        self.ops: list[ex.Op] = []
        self.members: list[str] = list(S)
        self.sync_reports = sync_reports

    def __call__(self, op: ex.Op) -> Any:
        self.ops.append(op)
        if isinstance(op, ex.SetMembers):
            ids = [r for r in self.members if r not in op.replica_ids]
            self.members = ids + list(op.replica_ids) if op.add else ids
            return tuple(self.members)
        if isinstance(op, ex.ReadProgress):
            return ex.RolloutProgress(total_generated=0, completed_steps=1)
        if isinstance(op, ex.SyncReplicas):
            if self.sync_reports:
                return self.sync_reports.pop(0)
            return Report(replica_ids=list(op.replica_ids), version=op.version)
        if isinstance(op, ex.ResetRollouter):
            return {"fully_async/rollouter/idle_ratio": 0.25}
        return None

    def without_audits(self) -> list[ex.Op]:
        return [op for op in self.ops if not isinstance(op, ex.Audit)]


def weights_ready(version: int) -> TrainerEvent:
    return TrainerEvent(phase=TrainerPhase.WEIGHTS_READY, global_steps=version, version=version,
                        weights_path=f"/w/{version}")


def test_an_activating_sync_syncs_standalones_then_releases_the_trainer_then_wakes_hybrids() -> None:
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True)), clock=lambda: 0.0)
    peers = Peers()
    reply = ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    assert reply == TrainerReply(action=TrainerAction.SYNC_DONE, global_steps=1, activated=True)
    assert peers.without_audits() == [
        ex.ReadProgress(), ex.Checkpoint(),
        ex.SyncReplicas(replica_ids=S, version=1, weights_path="/w/1"),
        ex.ReleaseTrainer(),
        ex.WorkerCall(replica_ids=H, action=CommandAction.WAKE),
        ex.SyncReplicas(replica_ids=H, version=1, weights_path="/w/1"),
        ex.SetMembers(replica_ids=H, add=True), ex.SetActiveReplicas(num_replicas=3),
        ex.WorkerCall(replica_ids=H, action=CommandAction.RESUME),
        ex.ClearSticky(),
        ex.WorkerCall(replica_ids=S + H, action=CommandAction.ABORT),
        ex.WorkerCall(replica_ids=S + H, action=CommandAction.RESUME),
        ex.ResetRollouter(version=1),
    ]
    assert executor.serving_hybrids == H
    assert executor.last_report.cycle_metrics()["fully_async/rollouter/idle_ratio"] == 0.25


def test_a_sync_that_keeps_hybrids_asleep_syncs_only_the_standalones_and_never_releases_the_trainer() -> None:
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=False)), clock=lambda: 0.0)
    peers = Peers()
    reply = ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    assert reply.activated is False
    assert peers.without_audits() == [ex.ReadProgress(), ex.Checkpoint(),
                                      ex.SyncReplicas(replica_ids=S, version=1, weights_path="/w/1"),
                                      ex.ResetRollouter(version=1)]


def test_a_failed_push_counts_one_push_and_one_fallback_and_is_audited_with_its_error() -> None:
    failed = Report(replica_ids=list(S), version=1, transport="gloo", pushed=True, ok=False,
                    error="ValueError: no", push_s=0.5)
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=False)), clock=lambda: 0.0)
    peers = Peers(sync_reports=[failed])
    ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    metrics = executor.last_report.cycle_metrics()
    assert (metrics["weights/pushes"], metrics["weights/push_fallbacks"]) == (1.0, 1.0)
    [push] = [op.event for op in peers.ops if isinstance(op, ex.Audit) and op.event.kind is AuditKind.PUSH]
    assert push == ex.AuditRecord(kind=AuditKind.PUSH, version=1, transport="gloo", replica_ids=S, ok=False,
                                  error="ValueError: no", duration_s=0.5,
                                  detail="gloo ['standalone_0'] failed: ValueError: no 0.500s")


def test_a_sync_pushed_in_groups_counts_and_audits_each_push_and_each_fallback() -> None:
    """ipc pushes one hybrid at a time: hybrid_1's push failed (it reloaded from disk), hybrid_0's did not."""
    hybrids = Report(replica_ids=list(H), version=1, transport="ipc", pushed=True, ok=False, error="E",
                     push_s=0.75, pushes=[PushGroupReport(replica_ids=["hybrid_0"], push_s=0.5),
                                          PushGroupReport(replica_ids=["hybrid_1"], ok=False, error="E",
                                                          push_s=0.25)])
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True)), clock=lambda: 0.0)
    peers = Peers(sync_reports=[Report(replica_ids=list(S), version=1), hybrids])
    ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    metrics = executor.last_report.cycle_metrics()
    assert (metrics["weights/pushes"], metrics["weights/push_fallbacks"]) == (2.0, 1.0)
    pushes = [op.event for op in peers.ops if isinstance(op, ex.Audit) and op.event.kind is AuditKind.PUSH]
    assert [(e.replica_ids, e.ok, e.error, e.duration_s) for e in pushes] == [
        (("hybrid_0",), True, "", 0.5), (("hybrid_1",), False, "E", 0.25)]


def test_a_micro_step_with_active_hybrids_waits_then_removes_aborts_and_sleeps_them_in_order() -> None:
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True, wait=7)), clock=lambda: 0.0)
    ex.drive(executor.on_weights_ready(weights_ready(0)), Peers())
    peers = Peers()
    peers.members = list(S + H)
    event = TrainerEvent(phase=TrainerPhase.MICRO_STEP_START, global_steps=1, version=0)
    reply = ex.drive(executor.on_micro_step_start(event), peers)
    assert reply.action is TrainerAction.GPUS_READY
    assert peers.without_audits() == [
        ex.Checkpoint(), ex.AwaitSamples(min_queue_size=7),
        ex.ReadProgress(),  # the hybrids' window closes: the controller measures what it produced
        ex.SetMembers(replica_ids=H, add=False), ex.SetActiveReplicas(num_replicas=1),
        ex.WorkerCall(replica_ids=H, action=CommandAction.ABORT),
        ex.WorkerCall(replica_ids=H, action=CommandAction.SLEEP),
    ]
    assert executor.serving_hybrids == ()


def test_the_rollouter_counts_every_standalone_even_while_the_lb_holds_them_out_of_routing_as_dead() -> None:
    """After a Redis pause that expired every heartbeat, the LB had no member left when the hybrids were
    removed: the rollouter was told 0 replicas, and its feed stopped for good once the standalones were
    back (nothing announces a return)."""
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True, wait=7)), clock=lambda: 0.0)
    ex.drive(executor.on_weights_ready(weights_ready(0)), Peers())
    peers = Peers()
    peers.members = list(H)  # the standalone is out of routing: its heartbeat expired
    event = TrainerEvent(phase=TrainerPhase.MICRO_STEP_START, global_steps=1, version=0)
    ex.drive(executor.on_micro_step_start(event), peers)
    assert ex.SetActiveReplicas(num_replicas=len(S)) in peers.ops


# ---- core.trainer_cycle ------------------------------------------------------------------------


def test_the_trainer_cycle_syncs_first_then_trains_and_syncs_every_trigger_micro_steps() -> None:
    limits = FlowLimits(ppo_mini_batch_size=2, require_batches=1, trigger_parameter_sync_step=2,
                        staleness_threshold=0.0, total_rollout_steps=4)
    cycle = tc.TrainerCycle(limits=limits, clock=lambda: 0.0)
    ops: list[tc.TrainerOp] = []

    def perform(op: tc.TrainerOp) -> Any:
        ops.append(op)
        if isinstance(op, tc.Handshake):
            return TrainerReply(action=tc.REPLY_TO[op.event.phase], global_steps=op.event.global_steps)
        if isinstance(op, tc.QueueSize):
            return 1
        if isinstance(op, tc.Collect):
            return ["s"] * op.count
        if isinstance(op, tc.Train):
            return tc.TrainResult(timings={"timing_s/update_actor": 1.0})
        if isinstance(op, tc.ExportWeights):
            return f"/w/{op.version}"
        if isinstance(op, tc.SaveCheckpoint):
            return f"ckpt-{op.global_steps}"
        return None

    ex.drive(cycle.run(), perform)  # type: ignore[arg-type]
    phases = [(op.event.phase, op.event.global_steps, op.event.version) for op in ops
              if isinstance(op, tc.Handshake | tc.Send)]
    P = TrainerPhase
    assert phases == [(P.WEIGHTS_READY, 0, 0),
                      (P.MICRO_STEP_START, 1, 0), (P.COLLECTED, 1, 0), (P.MICRO_STEP_DONE, 1, 0),
                      (P.MICRO_STEP_START, 2, 0), (P.COLLECTED, 2, 0), (P.WEIGHTS_READY, 2, 1),
                      (P.MICRO_STEP_DONE, 2, 1), (P.DONE, 2, 1)]
    collected = [op.event for op in ops if isinstance(op, tc.Send) and op.event.phase is P.COLLECTED]
    assert [e.wait_samples for e in collected] == [1, 1]  # required 2, one queued at the start
    done = [op.event for op in ops if isinstance(op, tc.Send) and op.event.phase is P.MICRO_STEP_DONE]
    assert done[0].stats["dynamic_resource/train_compute_time_s"] == 1.0
    saves = [op for op in ops if isinstance(op, tc.SaveCheckpoint)]
    assert saves == [tc.SaveCheckpoint(version=0, global_steps=2),
                     tc.SaveCheckpoint(version=1, global_steps=3)]
    assert ops.index(saves[-1]) < ops.index(tc.ExportWeights(version=1))
    commits = [op.progress for op in ops if isinstance(op, tc.MarkTrained)]  # the pointer in the commit
    assert [(p.global_steps, p.checkpoint) for p in commits] == [(2, "ckpt-2"), (3, "ckpt-3")]


# ---- core.sample_lifecycle ---------------------------------------------------------------------


def lifecycle(*, total: int = 100, partial_rollout: bool = True) -> SampleLifecycle:
    limits = FlowLimits(ppo_mini_batch_size=2, require_batches=1, trigger_parameter_sync_step=2,
                        staleness_threshold=0.5, total_rollout_steps=total)  # max_required = 6
    life = SampleLifecycle(limits=limits, concurrent_samples_per_replica=4, now_s=0.0,
                           partial_rollout=partial_rollout)
    life.set_replicas(2, 0.0)
    return life


def test_the_idle_seconds_add_up_every_idle_window_across_versions_and_the_open_one_to_now() -> None:
    life = lifecycle()
    tracker = life.tracker
    tracker.on_idle_start(2.0)
    tracker.on_idle_end(4.0)
    tracker.on_idle_start(8.0)
    tracker.reset(num_active=0, queue_size=0, now_s=10.0)  # closes the window opened at 8
    tracker.on_idle_start(12.0)
    assert life.status().idle_seconds(15.0) == pytest.approx(2.0 + 2.0 + 3.0)
    assert (tracker.idle_closed_total_s, tracker.idle_open_since_s) == (4.0, 12.0)


def test_the_published_status_reads_back_the_same_idle_seconds_and_an_old_hash_reads_as_never_idle() -> None:
    status = RolloutStatus(paused=True, active_tasks=0, feed_done=False, idle_closed_s=6.5, idle_since_s=20.0)
    decoded = RolloutStatus.from_hash({k: str(v) for k, v in status.to_hash().items()})
    assert decoded == status and decoded.idle_seconds(23.0) == 9.5
    old = RolloutStatus.from_hash({"paused": "0", "active_tasks": "2", "feed_done": "0"})
    assert (old.idle_closed_s, old.idle_since_s, old.idle_seconds(50.0)) == (0.0, None, 0.0)
    assert RolloutStatus.from_hash({k: str(v) for k, v in old.to_hash().items()}) == old


def test_the_feed_stops_at_the_staleness_limit_and_only_the_monitor_or_a_reset_resumes_it() -> None:
    life = lifecycle()
    started = [life.next_sample(mq_size=0, now_s=1.0) for _ in range(7)]
    assert started[:6] == [f"sample_0_{i}" for i in range(6)] and started[6] is None
    assert life.tracker.paused
    for sample_id in started[:6]:
        life.on_enqueued(sample_id, 2.0)  # queued: never dropped, whatever the queue size
    assert life.next_sample(mq_size=6, now_s=2.0) is None  # latched
    assert life.monitor(mq_size=6, now_s=2.1) is False
    assert life.status() == RolloutStatus(paused=True, active_tasks=0, feed_done=False,
                                          max_concurrent_samples=6, staleness_samples=6,
                                          idle_since_s=2.1)  # idle from the monitor's tick
    assert life.status().stalled
    report = life.reset(version=1, mq_size=2, now_s=4.0)
    assert report["fully_async/rollouter/step_generated_samples"] == 6
    assert report["fully_async/rollouter/idle_ratio"] == 1 - 2.1 / 4.0  # idle from the monitor's tick
    assert life.next_sample(mq_size=2, now_s=4.0) == "sample_0_6"


def test_without_partial_rollout_no_sample_starts_until_a_version_is_live_even_after_a_restart() -> None:
    life = lifecycle(partial_rollout=False)
    assert life.next_sample(mq_size=0, now_s=0.0) is None and not life.tracker.paused
    life.reset(version=0, mq_size=0, now_s=1.0)
    assert life.next_sample(mq_size=0, now_s=1.0) == "sample_0_0"
    restarted = lifecycle(partial_rollout=False)
    restarted.restore(fed=0, total_generated=0, completed_steps=1, version=0, synced=False)
    assert restarted.next_sample(mq_size=0, now_s=2.0) is None
    restarted.restore(fed=1, total_generated=0, completed_steps=1, version=0, synced=True)
    assert restarted.next_sample(mq_size=0, now_s=2.0) == "sample_0_1"
    assert lifecycle().next_sample(mq_size=0, now_s=0.0) == "sample_0_0"  # with it: at once


def test_the_feed_never_exceeds_max_concurrent_and_ends_at_total_rollout_steps() -> None:
    life = lifecycle(total=3)
    life.set_replicas(0, 0.0)
    assert life.next_sample(mq_size=0, now_s=0.0) is None and not life.tracker.paused
    life.set_replicas(1, 0.0)
    assert [life.next_sample(mq_size=0, now_s=0.0) for _ in range(4)] == [
        "sample_0_0", "sample_0_1", "sample_0_2", None]
    assert life.feed_done and not life.status().stalled


def test_a_sample_handed_over_by_a_hybrid_counts_once_and_on_time_only_if_queued_before_the_sync() -> None:
    life = lifecycle()
    early, late, never = (life.next_sample(mq_size=0, now_s=1.0) for _ in range(3))
    assert early and late and never
    for sample_id in (early, early, late):  # two trajectories of `early` aborted on hybrids
        life.on_handed_over(sample_id)
    life.on_handed_over("sample_0_99")  # not generating (already queued, or never fed): not counted
    life.on_enqueued(early, 2.0)
    life.on_enqueued(never, 2.0)
    status = life.status()  # what the controller reads at the sync, before its decision
    assert (status.handed_over, status.handed_over_on_time) == (2, 1)
    assert RolloutStatus.from_hash({k: str(v) for k, v in status.to_hash().items()}) == status
    report = life.reset(version=1, mq_size=2, now_s=3.0)
    assert (report[HANDED_OVER], report[HANDED_OVER_ON_TIME]) == (2, 1)
    life.on_enqueued(late, 4.0)  # arrived in the next cycle: late for its window, nothing in the next
    report = life.reset(version=2, mq_size=1, now_s=5.0)
    assert (report[HANDED_OVER], report[HANDED_OVER_ON_TIME]) == (0, 0)


class Ticking:
    """A live-like clock: `now` is the world's time, and every read is a microsecond later than the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now


def test_a_live_clock_that_moves_between_reads_measures_the_hybrid_window_at_its_own_fill_rate() -> None:
    clock = Ticking()
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True, wait=7)), clock=clock)
    generated = {"total": 0}

    class Producing(Peers):
        """Peers whose rollouter reports `generated`, and whose waits take world time."""

        def __call__(self, op: ex.Op) -> Any:
            if isinstance(op, ex.ReadProgress):
                self.ops.append(op)
                return ex.RolloutProgress(total_generated=generated["total"], completed_steps=1)
            if isinstance(op, ex.AwaitSamples):  # the window: 20 samples in 10 s
                clock.now += 10.0
                generated["total"] += 20
            return super().__call__(op)

    ex.drive(executor.on_weights_ready(weights_ready(0)), Producing())
    peers = Producing()
    peers.members = list(S + H)
    event = TrainerEvent(phase=TrainerPhase.MICRO_STEP_START, global_steps=1, version=0)
    ex.drive(executor.on_micro_step_start(event), peers)
    clock.now += 30.0  # the cycle trains on standalones alone: 60 samples, no hybrid serving
    generated["total"] += 60
    ex.drive(executor.on_weights_ready(weights_ready(1)), Producing())
    assert executor.meter.hybrid_window_samples_per_s == pytest.approx(2.0, rel=1e-3)
    assert executor.meter.last_hybrid_window_samples_per_s == pytest.approx(2.0, rel=1e-3)
