"""Scheduling policies: the seed's API plus the built-in policies, all registered on import.

`from policies import DynamicSchedulePolicyBase, DynamicScheduleContext, register_policy,
build_policy, load_policy_module, registered_policies`. User policies live in any
importable module named in config and are loaded with `load_policy_module`.
"""

from policies.adaptive_policy import AdaptiveDynamicSchedulePolicy
from policies.base import (
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    UnknownPolicyError,
    build_policy,
    load_policy_module,
    register_policy,
    registered_policies,
    validate_ratio,
)
from policies.default_policy import DefaultDynamicSchedulePolicy
from policies.fixed_ratio_policy import FixedRatioDynamicSchedulePolicy
from policies.static_fully_async_policy import StaticFullyAsyncPolicy

__all__ = [
    "AdaptiveDynamicSchedulePolicy",
    "DefaultDynamicSchedulePolicy",
    "DynamicScheduleContext",
    "DynamicSchedulePolicyBase",
    "FixedRatioDynamicSchedulePolicy",
    "StaticFullyAsyncPolicy",
    "UnknownPolicyError",
    "build_policy",
    "load_policy_module",
    "register_policy",
    "registered_policies",
    "validate_ratio",
]
