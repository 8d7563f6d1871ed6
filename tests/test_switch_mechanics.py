"""The switch mechanics beyond the seed's order (folded hybrid sync, offload overlapped with the wake,
onload overlapped with the sleep) keep the seed's invariants: one weight version on every serving replica
after a sync, the trainer's GPUs released before a hybrid wakes and never computed on while a hybrid holds
them, and no request reaching a removed replica. Pure tests of the cores, then the simulator end to end."""

from __future__ import annotations

import pytest

from core import executor as ex
from core.controller import (
    AddReplicas,
    Mode,
    ResetStaleness,
    ResumeReplicas,
    SyncWeights,
    WakeReplicas,
)
from shared.schema import CommandAction, TrainerAction, TrainerEvent, TrainerPhase
from sim.run import Simulation
from sim.scenario import load_scenario
from tests.test_controller_core import H, S, SpyPolicy, make_core
from tests.test_one_orchestration import SCENARIO
from tests.test_orchestration_cores import Peers, weights_ready


def test_a_folded_activation_wakes_the_hybrids_then_syncs_every_replica_in_one_sync():
    core = make_core(policy=SpyPolicy(activate=True, rebalance=False), fold_hybrid_sync=True)
    commands = core.begin_sync(global_steps=4, version=2, total_generated_samples=0, completed_steps=1)
    assert commands == [WakeReplicas(replica_ids=H), SyncWeights(replica_ids=S + H, version=2),
                        AddReplicas(replica_ids=H), ResumeReplicas(replica_ids=H), ResetStaleness(version=2)]


def test_folding_changes_nothing_when_the_sync_does_not_activate():
    core = make_core(policy=SpyPolicy(activate=False), fold_hybrid_sync=True)
    commands = core.begin_sync(global_steps=4, version=2, total_generated_samples=0, completed_steps=1)
    assert commands == [SyncWeights(replica_ids=S, version=2), ResetStaleness(version=2)]


def test_the_seed_order_stays_the_default():
    core = make_core(policy=SpyPolicy(activate=True, rebalance=False))
    commands = core.begin_sync(global_steps=4, version=2, total_generated_samples=0, completed_steps=1)
    assert commands[:3] == [SyncWeights(replica_ids=S, version=2), WakeReplicas(replica_ids=H),
                            SyncWeights(replica_ids=H, version=2)]


def test_the_fold_option_survives_a_controller_restart():
    core = make_core(policy=SpyPolicy(activate=True), fold_hybrid_sync=True)
    restored = type(core).restore(core.snapshot(), policy=SpyPolicy(activate=True))
    assert restored.fold_hybrid_sync is True


def test_an_overlapped_wake_releases_the_trainer_and_wakes_the_hybrids_at_once_before_any_hybrid_sync():
    core = make_core(policy=SpyPolicy(activate=True, rebalance=False), fold_hybrid_sync=True)
    executor = ex.ExecutorCore(core=core, clock=lambda: 0.0, overlap_wake=True)
    peers = Peers()
    ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    ops = peers.without_audits()
    overlapped = ex.Concurrently(ops=(ex.ReleaseTrainer(), ex.WorkerCall(replica_ids=H,
                                                                         action=CommandAction.WAKE)))
    folded_sync = ex.SyncReplicas(replica_ids=S + H, version=1, weights_path="/w/1")
    assert ops.index(overlapped) < ops.index(folded_sync)
    assert ex.ReleaseTrainer() not in ops  # only inside the concurrent op
    assert core.mode is Mode.HYBRID_ACTIVE


def test_without_overlap_the_trainer_is_released_before_the_wake_is_sent():
    core = make_core(policy=SpyPolicy(activate=True, rebalance=False), fold_hybrid_sync=True)
    executor = ex.ExecutorCore(core=core, clock=lambda: 0.0)
    peers = Peers()
    ex.drive(executor.on_weights_ready(weights_ready(1)), peers)
    ops = peers.without_audits()
    wake = ex.WorkerCall(replica_ids=H, action=CommandAction.WAKE)
    assert ops.index(ex.ReleaseTrainer()) + 1 == ops.index(wake)


def test_an_overlapped_sleep_onloads_the_trainer_while_the_hybrids_sleep_before_its_gpus_are_ready():
    executor = ex.ExecutorCore(core=make_core(policy=SpyPolicy(activate=True, wait=7)), clock=lambda: 0.0,
                               overlap_sleep=True)
    ex.drive(executor.on_weights_ready(weights_ready(0)), Peers())
    peers = Peers()
    peers.members = list(S + H)
    event = TrainerEvent(phase=TrainerPhase.MICRO_STEP_START, global_steps=1, version=0)
    reply = ex.drive(executor.on_micro_step_start(event), peers)
    assert reply.action is TrainerAction.GPUS_READY  # only once the sleep and the onload both ended
    ops = peers.without_audits()
    assert ops[-2:] == [ex.WorkerCall(replica_ids=H, action=CommandAction.ABORT),
                        ex.Concurrently(ops=(ex.WorkerCall(replica_ids=H, action=CommandAction.SLEEP),
                                             ex.AcquireTrainer()))]
    assert ops.index(ex.SetMembers(replica_ids=H, add=False)) < len(ops) - 2  # routing cut first


def test_an_overlapped_sleep_saves_the_shorter_of_sleep_and_onload_on_each_deactivation_in_the_simulator():
    base = load_scenario(SCENARIO).with_policy("adaptive").with_prompts(320).with_changes(
        {"trainer.offload_s": 2.0, "rollout.sim.sleep_s": 3.0})
    trainer_lost_s: dict[bool, list[float]] = {}
    for overlap in (False, True):
        sim = Simulation(base.with_changes({"async_training.dynamic_schedule_overlap_sleep": overlap}))
        lost = trainer_lost_s[overlap] = []
        update_after_step = sim.policy.update_after_step

        def recording(global_steps, ctx, _lost=lost, _update=update_after_step):
            if ctx.last_deactivate_duration_s:  # the deactivation, plus the offload and onload around it
                _lost.append(ctx.last_deactivate_duration_s + ctx.last_switch_overhead_s)
            _update(global_steps, ctx)

        sim.policy.update_after_step = recording  # type: ignore[method-assign]
        sim.run()
    assert trainer_lost_s[False] and len(trainer_lost_s[True]) == len(trainer_lost_s[False])
    # sleep 3, then the onload 2 after GPUS_READY, against max(sleep 3, onload 2) before it
    saved = [apart - overlapped for apart, overlapped in zip(trainer_lost_s[False], trainer_lost_s[True],
                                                          strict=True)]
    assert saved == pytest.approx([2.0] * len(saved))


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_in_the_simulator_every_serving_replica_holds_the_new_version_after_each_sync(
        fold: bool, overlap: bool):
    scenario = load_scenario(SCENARIO).with_policy("adaptive").with_prompts(320).with_changes(
        {"async_training.dynamic_schedule_fold_hybrid_sync": fold,
         "async_training.dynamic_schedule_overlap_wake": overlap, "trainer.offload_s": 2.0})
    sim = Simulation(scenario)
    checked = []
    on_weights_ready = sim.executor.on_weights_ready

    def checking(event, **kwargs):
        reply = yield from on_weights_ready(event, **kwargs)
        serving = sim.rollouter.lb.replica_ids
        assert {sim.rollouter.replicas[r].version for r in serving} == {event.version}
        checked.append(event.version)
        return reply

    sim.executor.on_weights_ready = checking  # type: ignore[method-assign]
    result = sim.run()
    assert result.activations > 0 and len(checked) == result.versions + 1
    s = result.samples
    assert s["trained"] + s["queued"] + s["generating"] == s["fed"]
