"""Pure unit tests of the policy API and the three built-in policies (reference section 2.3)."""

from __future__ import annotations

import pytest

from policies import (
    DefaultDynamicSchedulePolicy,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    FixedRatioDynamicSchedulePolicy,
    StaticFullyAsyncPolicy,
    UnknownPolicyError,
    build_policy,
    load_policy_module,
    register_policy,
    registered_policies,
)
from policies.default_policy import DEFAULT_SWITCH_COST_S, INITIAL_PER_SAMPLE_TIME_S

BUILT_INS = ("default", "fixed_ratio", "static_fully_async")


def make_ctx(
    *,
    required_samples: int = 10,
    trigger_parameter_sync_step: int = 4,
    total_generated_samples: int = 0,
    expected_samples: int = 0,
    step_wait_times: list[float] | None = None,
    step_wait_samples: list[int] | None = None,
    only_hybrid: bool = False,
    last_activate_duration_s: float = 0.0,
    last_deactivate_duration_s: float = 0.0,
) -> DynamicScheduleContext:
    return DynamicScheduleContext(
        required_samples=required_samples,
        trigger_parameter_sync_step=trigger_parameter_sync_step,
        total_generated_samples=total_generated_samples,
        expected_samples=expected_samples,
        step_wait_times=list(step_wait_times or []),
        step_wait_samples=list(step_wait_samples or []),
        only_hybrid=only_hybrid,
        last_activate_duration_s=last_activate_duration_s,
        last_deactivate_duration_s=last_deactivate_duration_s,
    )


def make_default(*, ratio: float = 0.5, only_hybrid: bool = False) -> DefaultDynamicSchedulePolicy:
    policy = build_policy("default", deactivate_ratio=ratio, only_hybrid=only_hybrid)
    assert isinstance(policy, DefaultDynamicSchedulePolicy)
    return policy


# ---- context and registry ----


def test_context_derives_step_required_samples_once_from_required_and_trigger():
    ctx = make_ctx(required_samples=16, trigger_parameter_sync_step=4)
    assert ctx.step_required_samples == 64


def test_context_rejects_non_positive_required_samples_and_trigger():
    with pytest.raises(ValueError, match="required_samples"):
        make_ctx(required_samples=0)
    with pytest.raises(ValueError, match="trigger_parameter_sync_step"):
        make_ctx(trigger_parameter_sync_step=0)


def test_context_round_trips_through_a_plain_dict():
    ctx = make_ctx(total_generated_samples=7, step_wait_times=[1.5], step_wait_samples=[2])
    restored = DynamicScheduleContext.from_dict(ctx.to_dict())
    assert restored == ctx


def test_all_three_built_ins_are_registered_on_import():
    assert set(BUILT_INS) <= set(registered_policies())


def test_unknown_policy_name_raises_an_error_listing_registered_names():
    with pytest.raises(UnknownPolicyError) as err:
        build_policy("no_such_policy", deactivate_ratio=0.3, only_hybrid=False)
    message = str(err.value)
    assert "no_such_policy" in message
    for name in BUILT_INS:
        assert name in message
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)


def test_build_policy_rejects_a_ratio_outside_zero_one():
    with pytest.raises(ValueError, match="deactivate_ratio"):
        build_policy("default", deactivate_ratio=1.2, only_hybrid=False)
    with pytest.raises(ValueError, match="deactivate_ratio"):
        build_policy("fixed_ratio", deactivate_ratio=-0.1, only_hybrid=False)


def test_user_policy_written_as_in_the_seed_loads_by_module_name_and_builds():
    module = load_policy_module("tests.user_policy_example")
    assert "my_policy" in registered_policies()
    policy = build_policy("my_policy", deactivate_ratio=0.5, only_hybrid=False)
    assert isinstance(policy, module.MyDynamicSchedulePolicy)
    ctx = make_ctx(required_samples=10, trigger_parameter_sync_step=4, total_generated_samples=5,
                   expected_samples=10)
    assert policy.should_deactivate(1, True, ctx) is True
    assert policy.deactivate_wait_samples(ctx) == 20
    assert policy.should_activate_after_step(1, False, ctx) is True
    assert policy.update_after_step(1, ctx) is None
    assert policy.request_rebalance(1, ctx) is None
    assert policy.describe()["name"] == "my_policy"
    assert policy.describe()["deactivate_ratio"] == 0.5


def test_register_policy_refuses_a_class_that_is_not_a_policy():
    with pytest.raises(TypeError):
        register_policy("not_a_policy")(dict)  # type: ignore[type-var]


def test_base_class_defaults_are_no_ops_and_state_round_trips():
    @register_policy("test_minimal")
    class Minimal(DynamicSchedulePolicyBase):
        def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False):
            self.deactivate_ratio = deactivate_ratio
            self.only_hybrid = only_hybrid
            self.history: list[int] = []

        def should_deactivate(self, global_steps, is_hybrid_active, ctx):
            return is_hybrid_active

        def deactivate_wait_samples(self, ctx):
            return 0

        def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
            return False

    policy = build_policy("test_minimal", deactivate_ratio=0.25, only_hybrid=False)
    ctx = make_ctx()
    assert policy.update_after_step(3, ctx) is None
    assert policy.request_rebalance(3, ctx) is None
    policy.history.append(4)  # type: ignore[attr-defined]
    fresh = build_policy("test_minimal", deactivate_ratio=0.9, only_hybrid=False)
    fresh.load_state_dict(policy.state_dict())
    assert fresh.describe()["deactivate_ratio"] == 0.25
    assert fresh.history == [4]  # type: ignore[attr-defined]


# ---- admin setter ----


def test_set_deactivate_ratio_accepts_zero_to_one_and_rejects_the_rest():
    policy = make_default(ratio=0.3)
    policy.set_deactivate_ratio(0.8)
    assert policy.describe()["deactivate_ratio"] == 0.8
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError):
            policy.set_deactivate_ratio(bad)
    assert policy.deactivate_ratio == 0.8


def test_set_deactivate_ratio_refuses_anything_but_one_in_colocated_mode():
    policy = make_default(only_hybrid=True)
    with pytest.raises(ValueError, match="only_hybrid"):
        policy.set_deactivate_ratio(0.5)
    policy.set_deactivate_ratio(1.0)


# ---- default policy: worked examples of reference section 2.3 ----


def test_default_ratio_rises_to_055_after_waiting_for_2_of_40_samples_then_falls_to_053():
    policy = make_default(ratio=0.5)
    ctx = make_ctx(required_samples=10, trigger_parameter_sync_step=4, step_wait_times=[3.0],
                   step_wait_samples=[2])
    policy.update_after_step(1, ctx)
    assert policy.deactivate_ratio == pytest.approx(0.55)
    policy.update_after_step(2, make_ctx(required_samples=10, trigger_parameter_sync_step=4))
    assert policy.deactivate_ratio == pytest.approx(0.53)


def test_default_ratio_increase_is_clipped_to_at_most_010():
    policy = make_default(ratio=0.5)
    policy.update_after_step(1, make_ctx(required_samples=10, step_wait_samples=[10, 10]))
    assert policy.deactivate_ratio == pytest.approx(0.6)


def test_default_ratio_never_exceeds_one_nor_drops_below_zero():
    high = make_default(ratio=0.97)
    high.update_after_step(1, make_ctx(step_wait_samples=[40]))
    assert high.deactivate_ratio == 1.0
    low = make_default(ratio=0.03)
    for step in range(1, 6):
        low.update_after_step(step, make_ctx())
    assert low.deactivate_ratio == 0.0


def test_default_skips_update_at_the_initial_sync_and_in_colocated_mode():
    policy = make_default(ratio=0.5)
    policy.update_after_step(0, make_ctx(step_wait_samples=[5], last_activate_duration_s=3.0))
    assert policy.deactivate_ratio == 0.5 and policy.recent_switch_overheads_s == []
    colocated = make_default(ratio=0.5, only_hybrid=True)
    colocated.update_after_step(5, make_ctx(only_hybrid=True))
    assert colocated.deactivate_ratio == 1.0


def test_default_waits_for_ratio_times_step_required_samples():
    policy = make_default(ratio=0.6)
    assert policy.deactivate_wait_samples(make_ctx(required_samples=16, trigger_parameter_sync_step=4)) == 38


def test_default_skips_activation_when_gap_of_10_costs_1s_at_01_s_per_sample():
    policy = make_default(ratio=0.5)
    ctx = make_ctx(total_generated_samples=110, expected_samples=100, step_wait_times=[0.5],
                   step_wait_samples=[5])
    assert policy.deactivate_gap(ctx) == pytest.approx(10)
    assert policy.should_activate_after_step(3, False, ctx) is False
    assert policy.per_sample_time_s == pytest.approx(0.1)


def test_default_activates_when_gap_of_10_costs_20s_at_2_s_per_sample():
    policy = make_default(ratio=0.5)
    ctx = make_ctx(total_generated_samples=110, expected_samples=100, step_wait_times=[10.0],
                   step_wait_samples=[5])
    assert policy.should_activate_after_step(3, False, ctx) is True


def test_default_does_not_activate_without_a_gap_and_keeps_its_estimate():
    policy = make_default(ratio=0.5)
    ctx = make_ctx(total_generated_samples=130, expected_samples=100, step_wait_times=[1.0],
                   step_wait_samples=[10])
    assert policy.should_activate_after_step(3, False, ctx) is False
    assert policy.per_sample_time_s == INITIAL_PER_SAMPLE_TIME_S


def test_default_activates_at_the_initial_sync_thanks_to_the_pessimistic_prior():
    policy = make_default(ratio=0.3)
    assert policy.should_activate_after_step(0, False, make_ctx()) is True


def test_default_keeps_the_last_per_sample_estimate_when_no_sample_was_waited_for():
    policy = make_default(ratio=0.5)
    policy.should_activate_after_step(1, False, make_ctx(step_wait_times=[4.0], step_wait_samples=[2]))
    assert policy.per_sample_time_s == pytest.approx(2.0)
    policy.should_activate_after_step(2, False, make_ctx(step_wait_times=[0.1], step_wait_samples=[0]))
    assert policy.per_sample_time_s == pytest.approx(2.0)


def test_default_switch_cost_is_the_mean_of_the_last_three_overheads_else_10s():
    policy = make_default(ratio=0.5)
    assert policy.switch_cost_s() == DEFAULT_SWITCH_COST_S
    for step, (act, deact) in enumerate([(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 5.0)], start=1):
        policy.update_after_step(step,
                                 make_ctx(last_activate_duration_s=act, last_deactivate_duration_s=deact))
    assert policy.switch_cost_s() == pytest.approx((4.0 + 6.0 + 9.0) / 3)
    policy.update_after_step(5, make_ctx())
    assert policy.switch_cost_s() == pytest.approx((4.0 + 6.0 + 9.0) / 3)


def test_default_describe_exposes_ratio_switch_cost_and_per_sample_time():
    info = make_default(ratio=0.4).describe()
    assert info["name"] == "default"
    assert info["deactivate_ratio"] == 0.4
    assert info["switch_cost_s"] == DEFAULT_SWITCH_COST_S
    assert info["per_sample_time_s"] == INITIAL_PER_SAMPLE_TIME_S


def test_default_state_survives_a_state_dict_round_trip():
    policy = make_default(ratio=0.5)
    policy.update_after_step(1, make_ctx(step_wait_samples=[4], last_activate_duration_s=2.0))
    policy.should_activate_after_step(1, False, make_ctx(step_wait_times=[6.0], step_wait_samples=[3]))
    fresh = make_default(ratio=0.5)
    fresh.load_state_dict(policy.state_dict())
    assert fresh.describe() == policy.describe()


# ---- fixed_ratio and static_fully_async ----


def test_fixed_ratio_never_adapts_and_activates_on_a_pure_gap_check():
    policy = build_policy("fixed_ratio", deactivate_ratio=0.5, only_hybrid=False)
    assert isinstance(policy, FixedRatioDynamicSchedulePolicy)
    policy.update_after_step(1, make_ctx(step_wait_samples=[20]))
    assert policy.deactivate_ratio == 0.5
    assert policy.deactivate_wait_samples(make_ctx()) == 20
    assert policy.should_activate_after_step(1, False,
                                             make_ctx(total_generated_samples=119, expected_samples=100))
    assert not policy.should_activate_after_step(1, False,
                                                 make_ctx(total_generated_samples=120, expected_samples=100))


def test_static_fully_async_deactivates_immediately_and_never_activates_with_standalones():
    policy = build_policy("static_fully_async", deactivate_ratio=0.3, only_hybrid=False)
    assert isinstance(policy, StaticFullyAsyncPolicy)
    ctx = make_ctx()
    assert policy.should_deactivate(1, True, ctx) is True
    assert policy.should_deactivate(1, False, ctx) is False
    assert policy.deactivate_wait_samples(ctx) == 0
    assert policy.should_activate_after_step(0, False, ctx) is False


@pytest.mark.parametrize("name", BUILT_INS)
def test_every_built_in_activates_at_every_sync_and_waits_a_full_cycle_in_colocated_mode(name):
    policy = build_policy(name, deactivate_ratio=0.3, only_hybrid=True)
    ctx = make_ctx(only_hybrid=True, total_generated_samples=500, expected_samples=40)
    for step in range(4):
        assert policy.should_activate_after_step(step, False, ctx) is True
        assert policy.deactivate_wait_samples(ctx) == ctx.step_required_samples
        policy.update_after_step(step, ctx)
