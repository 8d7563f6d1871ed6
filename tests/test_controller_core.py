"""Pure unit tests of the controller state machine and its sync-cycle protocol (core/controller.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from core.controller import (
    COMMAND_TYPES,
    TRANSITIONS,
    AbortReplicas,
    AddReplicas,
    Command,
    ControllerCore,
    IllegalTransitionError,
    Mode,
    Rebalance,
    RemoveReplicas,
    ResetStaleness,
    ResumeReplicas,
    SleepReplicas,
    SyncWeights,
    WaitForSamples,
    WakeReplicas,
    check_transition,
    command_from_dict,
    command_to_dict,
)
from policies import DynamicScheduleContext, DynamicSchedulePolicyBase, build_policy, load_policy_module

H = ("hybrid_0", "hybrid_1")
S = ("standalone_0",)


class SpyPolicy(DynamicSchedulePolicyBase):
    """Answers as told and records every call, to check the seed's call order."""

    def __init__(self, *, deactivate: bool = True, wait: int = 7, activate: bool = True,
                 rebalance: Any = None):
        self.deactivate, self.wait, self.activate, self.rebalance = deactivate, wait, activate, rebalance
        self.calls: list[str] = []
        self.seen: list[dict[str, Any]] = []

    def should_deactivate(self, global_steps, is_hybrid_active, ctx):
        self.calls.append("should_deactivate")
        return self.deactivate

    def deactivate_wait_samples(self, ctx):
        self.calls.append("deactivate_wait_samples")
        return self.wait

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        self.calls.append("should_activate_after_step")
        self.seen.append(ctx.to_dict())
        return self.activate

    def request_rebalance(self, global_steps, ctx):
        self.calls.append("request_rebalance")
        return self.rebalance

    def update_after_step(self, global_steps, ctx):
        self.calls.append("update_after_step")
        self.seen.append(ctx.to_dict())


def make_core(
    *,
    policy: DynamicSchedulePolicyBase | None = None,
    policy_name: str = "default",
    ratio: float = 0.5,
    hybrid_ids: tuple[str, ...] = H,
    standalone_ids: tuple[str, ...] = S,
    enable_rebalance: bool = True,
    required_samples: int = 10,
    trigger_parameter_sync_step: int = 2,
    staleness_threshold: float = 0.5,
    fold_hybrid_sync: bool = False,
) -> ControllerCore:
    only_hybrid = not standalone_ids
    if policy is None:
        policy = build_policy(policy_name, deactivate_ratio=ratio, only_hybrid=only_hybrid)
    ctx = DynamicScheduleContext(
        required_samples=required_samples,
        trigger_parameter_sync_step=trigger_parameter_sync_step,
        only_hybrid=only_hybrid,
        staleness_threshold=staleness_threshold,
    )
    return ControllerCore(
        policy=policy, ctx=ctx, hybrid_ids=hybrid_ids, standalone_ids=standalone_ids,
        enable_rebalance=enable_rebalance, fold_hybrid_sync=fold_hybrid_sync,
    )


def sync(core: ControllerCore, *, version: int, generated: int = 0, completed: int = 0, act_s: float = 1.0):
    """Run one whole sync the way a caller would; return its commands."""
    commands = core.begin_sync(
        global_steps=version, version=version, total_generated_samples=generated, completed_steps=completed
    )
    if core.mode is Mode.ACTIVATING:
        core.finish_activate(act_s)
    core.finish_sync(version)
    return commands


def micro_step(core: ControllerCore, *, step: int, deact_s: float = 1.0,
               wait_samples: int = 0) -> list[Command]:
    commands = core.begin_micro_step(step)
    if core.mode is Mode.DEACTIVATING:
        core.finish_deactivate(deact_s)
    core.record_collection(wait_time_s=0.5, wait_samples=wait_samples)
    return commands


def activation_commands(version: int) -> list[Command]:
    return [
        WakeReplicas(replica_ids=H),
        SyncWeights(replica_ids=H, version=version),
        AddReplicas(replica_ids=H),
        ResumeReplicas(replica_ids=H),
    ]


# ---- the table ----


def test_transition_table_is_one_cycle_through_all_four_modes():
    expected = {
        Mode.STANDALONE_ONLY: {Mode.ACTIVATING},
        Mode.ACTIVATING: {Mode.HYBRID_ACTIVE},
        Mode.HYBRID_ACTIVE: {Mode.DEACTIVATING},
        Mode.DEACTIVATING: {Mode.STANDALONE_ONLY},
    }
    assert expected == TRANSITIONS


@pytest.mark.parametrize(
    ("current", "target"),
    [(Mode.STANDALONE_ONLY, Mode.HYBRID_ACTIVE), (Mode.STANDALONE_ONLY, Mode.DEACTIVATING),
     (Mode.HYBRID_ACTIVE, Mode.STANDALONE_ONLY), (Mode.ACTIVATING, Mode.DEACTIVATING),
     (Mode.DEACTIVATING, Mode.ACTIVATING), (Mode.HYBRID_ACTIVE, Mode.HYBRID_ACTIVE)],
)  # fmt: skip
def test_check_transition_raises_on_every_illegal_move(current, target):
    with pytest.raises(IllegalTransitionError):
        check_transition(current, target)


# ---- activation at a sync ----


def test_initial_sync_syncs_standalones_first_then_activates_hybrids_in_order_and_resets_staleness_last():
    core = make_core()
    commands = core.begin_sync(global_steps=0, version=0, total_generated_samples=0, completed_steps=0)
    assert commands == [SyncWeights(replica_ids=S, version=0), *activation_commands(0), Rebalance(),
                        ResetStaleness(version=0)]  # fmt: skip
    assert core.mode is Mode.ACTIVATING
    core.finish_activate(2.5)
    assert core.mode is Mode.HYBRID_ACTIVE and core.activations == 1
    core.finish_sync(0)
    assert core.ctx.last_activate_duration_s == 0.0


def test_hybrid_weight_sync_is_skipped_entirely_when_not_activating():
    core = make_core(policy_name="static_fully_async")
    commands = sync(core, version=0)
    assert commands == [SyncWeights(replica_ids=S, version=0), ResetStaleness(version=0)]
    assert core.mode is Mode.STANDALONE_ONLY and core.activations == 0


def test_begin_sync_fills_the_context_before_asking_the_policy():
    spy = SpyPolicy()
    core = make_core(policy=spy, required_samples=10, trigger_parameter_sync_step=2, staleness_threshold=0.5)
    core.begin_sync(global_steps=3, version=3, total_generated_samples=75, completed_steps=3)
    seen = spy.seen[0]
    assert seen["total_generated_samples"] == 75
    assert seen["expected_samples"] == 60
    assert seen["buffer_samples"] == 10


def test_rebalance_is_omitted_when_disabled_or_vetoed_and_issued_when_the_policy_returns_none():
    disabled_spy = SpyPolicy()
    disabled = make_core(policy=disabled_spy, enable_rebalance=False)
    assert Rebalance() not in disabled.begin_sync(global_steps=0, version=0, total_generated_samples=0,
                                                  completed_steps=0)  # fmt: skip
    assert "request_rebalance" not in disabled_spy.calls
    vetoed = make_core(policy=SpyPolicy(rebalance=False))
    assert Rebalance() not in vetoed.begin_sync(global_steps=0, version=0, total_generated_samples=0,
                                                completed_steps=0)  # fmt: skip
    allowed = make_core(policy=SpyPolicy(rebalance=None))
    assert Rebalance() in allowed.begin_sync(global_steps=0, version=0, total_generated_samples=0,
                                             completed_steps=0)


def test_hybrids_still_active_at_a_sync_are_synced_too_and_stay_active():
    core = make_core()
    sync(core, version=0)
    commands = core.begin_sync(global_steps=1, version=1, total_generated_samples=0, completed_steps=0)
    assert commands == [SyncWeights(replica_ids=S, version=1), SyncWeights(replica_ids=H, version=1),
                        ResetStaleness(version=1)]  # fmt: skip
    assert core.mode is Mode.HYBRID_ACTIVE
    core.finish_sync(1)


# ---- deactivation at a micro-step ----


def test_micro_step_after_activation_waits_then_removes_aborts_and_sleeps_in_that_order():
    core = make_core(ratio=0.5, required_samples=10, trigger_parameter_sync_step=2)
    sync(core, version=0)
    commands = core.begin_micro_step(1)
    assert commands == [WaitForSamples(min_queue_size=10), RemoveReplicas(replica_ids=H),
                        AbortReplicas(replica_ids=H), SleepReplicas(replica_ids=H)]  # fmt: skip
    assert core.mode is Mode.DEACTIVATING
    core.finish_deactivate(3.0)
    assert core.mode is Mode.STANDALONE_ONLY and core.deactivations == 1
    assert core.ctx.last_deactivate_duration_s == 3.0


def test_micro_step_with_hybrids_inactive_issues_nothing():
    core = make_core(policy_name="static_fully_async")
    sync(core, version=0)
    assert core.begin_micro_step(1) == []
    assert core.mode is Mode.STANDALONE_ONLY


def test_active_hybrids_are_deactivated_without_waiting_even_when_the_policy_says_false():
    spy = SpyPolicy(deactivate=False)
    core = make_core(policy=spy)
    sync(core, version=0)
    commands = core.begin_micro_step(1)
    assert commands[0] == WaitForSamples(min_queue_size=0)
    assert [c.kind for c in commands[1:]] == ["remove_replicas", "abort_replicas", "sleep_replicas"]
    assert "deactivate_wait_samples" not in spy.calls


def test_policy_methods_are_called_in_the_seed_order_over_a_cycle():
    spy = SpyPolicy()
    core = make_core(policy=spy, trigger_parameter_sync_step=2)
    sync(core, version=0)
    micro_step(core, step=1)
    micro_step(core, step=2)
    sync(core, version=1, completed=1)
    assert spy.calls == [
        "should_activate_after_step", "request_rebalance", "update_after_step",
        "should_deactivate", "deactivate_wait_samples", "should_deactivate",
        "should_activate_after_step", "request_rebalance", "update_after_step",
    ]  # fmt: skip


def test_finish_sync_shows_the_policy_this_cycles_waits_and_durations_then_clears_them():
    spy = SpyPolicy()
    core = make_core(policy=spy, trigger_parameter_sync_step=2)
    sync(core, version=0, act_s=2.0)
    micro_step(core, step=1, deact_s=3.0, wait_samples=4)
    micro_step(core, step=2, wait_samples=1)
    sync(core, version=1, completed=1, act_s=5.0)
    updated = spy.seen[-1]
    assert updated["step_wait_samples"] == [4, 1] and updated["step_wait_times"] == [0.5, 0.5]
    assert updated["last_deactivate_duration_s"] == 3.0 and updated["last_activate_duration_s"] == 5.0
    assert core.ctx.step_wait_samples == [] and core.ctx.step_wait_times == []
    assert core.ctx.last_activate_duration_s == 0.0 and core.ctx.last_deactivate_duration_s == 0.0


def test_default_policy_adapts_through_the_core_and_skips_activation_with_a_backlog():
    core = make_core(ratio=0.5, required_samples=10, trigger_parameter_sync_step=4)
    sync(core, version=0)
    for step in range(1, 5):
        micro_step(core, step=step, wait_samples=1 if step == 1 else 0)
    commands = sync(core, version=1, generated=200, completed=1)
    assert core.policy.describe()["deactivate_ratio"] == pytest.approx(0.525)
    assert not any(set(getattr(c, "replica_ids", ())) & set(H) for c in commands)


# ---- zero hybrids, colocated mode ----


def test_zero_hybrid_replicas_issue_no_switch_commands_but_track_mode_and_counters():
    core = make_core(hybrid_ids=())
    assert sync(core, version=0) == [SyncWeights(replica_ids=S, version=0), ResetStaleness(version=0)]
    assert core.mode is Mode.HYBRID_ACTIVE and core.activations == 1
    assert core.begin_micro_step(1) == []
    assert core.mode is Mode.STANDALONE_ONLY and core.deactivations == 1


@pytest.mark.parametrize("policy_name", ["default", "fixed_ratio", "static_fully_async", "my_policy"])
def test_colocated_mode_never_stalls_every_sync_activates_and_deactivation_waits_a_full_cycle(policy_name):
    load_policy_module("tests.user_policy_example")
    core = make_core(policy_name=policy_name, ratio=0.3, standalone_ids=(), required_samples=8,
                     trigger_parameter_sync_step=2)  # fmt: skip
    for version in range(4):
        commands = sync(core, version=version, generated=16 * version, completed=version)
        assert commands[0] == WakeReplicas(replica_ids=H), f"version {version} did not activate"
        assert core.mode is Mode.HYBRID_ACTIVE
        assert core.begin_micro_step(2 * version + 1)[0] == WaitForSamples(min_queue_size=16)
        core.finish_deactivate(1.0)
        core.record_collection(wait_time_s=0.0, wait_samples=0)
        assert core.begin_micro_step(2 * version + 2) == []
        core.record_collection(wait_time_s=0.0, wait_samples=0)


def test_core_rejects_a_context_whose_only_hybrid_flag_contradicts_the_replicas():
    ctx = DynamicScheduleContext(required_samples=4, trigger_parameter_sync_step=1, only_hybrid=True)
    policy = build_policy("default", deactivate_ratio=0.5, only_hybrid=True)
    with pytest.raises(ValueError, match="only_hybrid"):
        ControllerCore(policy=policy, ctx=ctx, hybrid_ids=H, standalone_ids=S)


# ---- admin force ----


def test_force_activate_overrides_the_policy_at_the_next_sync_only():
    core = make_core(policy_name="static_fully_async")
    core.force(True)
    assert WakeReplicas(replica_ids=H) in sync(core, version=0)
    micro_step(core, step=1)
    micro_step(core, step=2)
    assert WakeReplicas(replica_ids=H) not in sync(core, version=1, completed=1)


def test_force_deactivate_skips_the_wait_at_the_next_micro_step():
    core = make_core(ratio=0.8)
    sync(core, version=0)
    core.force(False)
    assert core.begin_micro_step(1)[0] == WaitForSamples(min_queue_size=0)
    assert core.pending_force is None


def test_force_deactivate_with_hybrids_inactive_is_a_consumed_no_op():
    core = make_core(policy_name="static_fully_async")
    core.force(False)
    assert core.begin_micro_step(1) == []
    assert core.pending_force is None


# ---- illegal call orders ----


def test_begin_sync_while_deactivating_raises():
    core = make_core()
    sync(core, version=0)
    core.begin_micro_step(1)
    with pytest.raises(IllegalTransitionError):
        core.begin_sync(global_steps=1, version=1, total_generated_samples=0, completed_steps=0)


def test_out_of_order_calls_raise_illegal_transition():
    core = make_core()
    with pytest.raises(IllegalTransitionError):
        core.finish_deactivate(1.0)
    with pytest.raises(IllegalTransitionError):
        core.finish_activate(1.0)
    with pytest.raises(IllegalTransitionError):
        core.finish_sync(0)
    core.begin_sync(global_steps=0, version=0, total_generated_samples=0, completed_steps=0)
    with pytest.raises(IllegalTransitionError):
        core.finish_sync(0)  # before finish_activate
    with pytest.raises(IllegalTransitionError):
        core.begin_micro_step(1)
    core.finish_activate(1.0)
    with pytest.raises(IllegalTransitionError):
        core.begin_sync(global_steps=0, version=0, total_generated_samples=0, completed_steps=0)
    with pytest.raises(IllegalTransitionError):
        core.record_collection(wait_time_s=0.0, wait_samples=0)
    core.finish_sync(0)
    core.begin_micro_step(1)
    with pytest.raises(IllegalTransitionError):
        core.record_collection(wait_time_s=0.0, wait_samples=0)  # still deactivating


def test_negative_durations_and_waits_are_rejected():
    core = make_core(policy_name="static_fully_async")
    with pytest.raises(ValueError):
        core.record_collection(wait_time_s=-1.0, wait_samples=0)
    core.begin_sync(global_steps=0, version=0, total_generated_samples=0, completed_steps=0)
    core.finish_sync(0)
    core.force(True)
    core.begin_sync(global_steps=1, version=1, total_generated_samples=0, completed_steps=0)
    with pytest.raises(ValueError):
        core.finish_activate(-0.1)


# ---- commands and persistence ----


def test_commands_are_frozen_keyword_only_and_carry_unique_kinds():
    with pytest.raises(TypeError):
        SyncWeights(H, 1)  # type: ignore[misc]
    command = SyncWeights(replica_ids=H, version=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.version = 2  # type: ignore[misc]
    assert len(COMMAND_TYPES) == 10
    for cmd in [WaitForSamples(min_queue_size=3), command, Rebalance(), ResetStaleness(version=4)]:
        assert command_from_dict(json.loads(json.dumps(command_to_dict(cmd)))) == cmd


def test_restore_mid_deactivation_reissues_the_same_commands_and_can_finish():
    core = make_core()
    sync(core, version=0)
    issued = core.begin_micro_step(1)
    policy = build_policy("default", deactivate_ratio=0.9, only_hybrid=False)
    restored = ControllerCore.restore(json.loads(json.dumps(core.snapshot())), policy=policy)
    assert restored.mode is Mode.DEACTIVATING
    assert restored.recovery_commands() == issued
    restored.finish_deactivate(1.0)
    assert restored.mode is Mode.STANDALONE_ONLY and restored.recovery_commands() == []
    assert restored.policy.describe()["deactivate_ratio"] == 0.5


def test_restore_mid_activation_reissues_the_sync_and_keeps_counters_and_policy_state():
    core = make_core()
    sync(core, version=0)
    micro_step(core, step=1, wait_samples=1)
    micro_step(core, step=2)
    core.force(False)
    issued = core.begin_sync(global_steps=1, version=1, total_generated_samples=0, completed_steps=1)
    assert core.mode is Mode.ACTIVATING
    fresh_policy = build_policy("default", deactivate_ratio=0.5, only_hybrid=False)
    restored = ControllerCore.restore(json.loads(json.dumps(core.snapshot())), policy=fresh_policy)
    assert restored.recovery_commands() == issued
    assert (restored.activations, restored.deactivations, restored.pending_force) == (1, 1, False)
    assert restored.ctx == core.ctx
    restored.finish_activate(1.0)
    restored.finish_sync(1)
    core.finish_activate(1.0)
    core.finish_sync(1)
    assert restored.policy.describe() == core.policy.describe()
    assert restored.snapshot() == core.snapshot()


def test_restore_under_a_different_policy_name_starts_that_policy_fresh():
    core = make_core(ratio=0.5)
    policy = build_policy("fixed_ratio", deactivate_ratio=0.2, only_hybrid=False)
    restored = ControllerCore.restore(core.snapshot(), policy=policy)
    assert restored.policy.describe()["deactivate_ratio"] == 0.2


def test_describe_reports_mode_counters_and_policy():
    core = make_core()
    sync(core, version=0)
    info = core.describe()
    assert info["mode"] == "hybrid_active" and info["activations"] == 1
    assert info["policy"]["name"] == "default"
