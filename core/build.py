"""One way to build the controller's cores from a run's settings: the services and the simulator both call it.

Where it sits: the controller service (`services/controller/service.py`) builds its cores from the run's
`Config` (`async_training` is a `shared.config.AsyncTrainingConfig`); the simulator (`sim/run.py`) from a
scenario (`sim.scenario.FlowSettings`, the same field names). Both pass the replicas they run and the
clock they run on; which policy, which context and which switch mechanics follow from the settings here
alone, so a setting cannot mean one thing live and another in the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from core.controller import ControllerCore
from core.executor import ExecutorCore
from policies import DynamicScheduleContext, build_policy

STATIC_POLICY = "static_fully_async"
"""The policy of a run without dynamic scheduling: plain fully-async, no switch counted, no ratio adapting."""


class ScheduleSettings(Protocol):
    """The `async_training` fields the controller is built from (read-only)."""

    @property
    def use_dynamic_resource_scheduling(self) -> bool: ...
    @property
    def dynamic_schedule_policy(self) -> str: ...
    @property
    def dynamic_schedule_deactivate_ratio(self) -> float: ...
    @property
    def dynamic_schedule_enable_rebalance(self) -> bool: ...
    @property
    def dynamic_schedule_fold_hybrid_sync(self) -> bool: ...
    @property
    def dynamic_schedule_overlap_wake(self) -> bool: ...
    @property
    def dynamic_schedule_overlap_sleep(self) -> bool: ...
    @property
    def trigger_parameter_sync_step(self) -> int: ...
    @property
    def staleness_threshold(self) -> float: ...
    @property
    def concurrent_samples_per_replica(self) -> int: ...
    @property
    def hybrid_concurrent_samples_per_replica(self) -> int | None: ...
    @property
    def partial_rollout(self) -> bool: ...


def policy_name(settings: ScheduleSettings) -> str:
    """The configured policy, or static_fully_async where dynamic scheduling is off."""
    return settings.dynamic_schedule_policy if settings.use_dynamic_resource_scheduling else STATIC_POLICY


def build_controller_core(settings: ScheduleSettings, *, required_samples: int, responses_per_sample: int,
                          max_running_requests_per_replica: int, hybrid_ids: tuple[str, ...],
                          standalone_ids: tuple[str, ...], total_samples: int = 0) -> ControllerCore:
    """The policy (by name: a user policy's module must be loaded first), its context and the core
    (`responses_per_sample`: data.n; `max_running_requests_per_replica`: rollout.max_num_seqs;
    `total_samples`: data.total_rollout_steps)."""
    only_hybrid = not standalone_ids
    policy = build_policy(policy_name(settings), deactivate_ratio=settings.dynamic_schedule_deactivate_ratio,
                          only_hybrid=only_hybrid)
    ctx = DynamicScheduleContext(
        required_samples=required_samples, trigger_parameter_sync_step=settings.trigger_parameter_sync_step,
        only_hybrid=only_hybrid, staleness_threshold=settings.staleness_threshold,
        partial_rollout=settings.partial_rollout,
        concurrent_samples_per_replica=settings.concurrent_samples_per_replica,
        hybrid_concurrent_samples_per_replica=settings.hybrid_concurrent_samples_per_replica or 0,
        responses_per_sample=responses_per_sample,
        max_running_requests_per_replica=max_running_requests_per_replica, total_samples=total_samples)
    return ControllerCore(policy=policy, ctx=ctx, hybrid_ids=hybrid_ids, standalone_ids=standalone_ids,
                          enable_rebalance=settings.dynamic_schedule_enable_rebalance,
                          fold_hybrid_sync=settings.dynamic_schedule_fold_hybrid_sync)


def build_executor_core(settings: ScheduleSettings, *, core: ControllerCore,
                        clock: Callable[[], float]) -> ExecutorCore:
    """The command semantics around `core`, with the settings' switch overlaps, on `clock`."""
    return ExecutorCore(core=core, clock=clock, overlap_wake=settings.dynamic_schedule_overlap_wake,
                        overlap_sleep=settings.dynamic_schedule_overlap_sleep)
