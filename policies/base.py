"""The seed's policy API: context, abstract base class and registry.

Where it sits: `shared <- policies <- core <- services, sim`. A policy is pure
decision code. The controller core (`core/controller.py`) fills one
`DynamicScheduleContext` and calls the policy's five methods in the seed's
order; the policy reads everything it needs from that context and does no I/O
and reads no clock, so the very same object runs inside the live controller
service and inside the discrete-event simulator.

Why this module exists: users port policies written for the original
(`verl.experimental.fully_async_policy.dynamic_schedule`) by changing one
import line. Method names and signatures are therefore exactly the seed's.
Additions over the original, all optional for a user policy:

- `load_policy_module(name)` imports a user module so its `@register_policy`
  fires; config names the module, nobody edits `policies/__init__.py`.
- `describe()`, `set_deactivate_ratio()`, `state_dict()`/`load_state_dict()`
  on the base class, for the admin API and crash-safe persistence.
"""

from __future__ import annotations

import copy
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any, ClassVar, TypeVar


class UnknownPolicyError(KeyError, ValueError):
    """`build_policy` was given a name nobody registered.

    A KeyError (as in the original) and a ValueError (bad config) at once; the
    message lists every registered name.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown policy"


@dataclass
class DynamicScheduleContext:
    """Everything a policy may look at; one object, mutated in place by the controller core.

    Field names are the original's, so ported policies read the same attributes.
    Static fields are fixed for a run; runtime fields are refreshed by the
    controller core at each sync (`core.controller.ControllerCore.begin_sync`)
    and the per-cycle lists/durations are cleared after `update_after_step`.
    """

    required_samples: int
    """Samples per trainer micro-step: ppo_mini_batch_size x require_batches (static)."""
    trigger_parameter_sync_step: int
    """Micro-steps per weight-sync cycle (static, >= 1)."""
    total_generated_samples: int = 0
    """Samples successfully enqueued by the rollouter since training began (refreshed at sync)."""
    expected_samples: int = 0
    """step_required_samples x completed_steps: roughly the samples consumed so far (refreshed at sync)."""
    buffer_samples: int = 0
    """step_required_samples x staleness_threshold, the original code's formula (its docs say
    expected x staleness; no built-in policy reads it)."""
    step_wait_times: list[float] = field(default_factory=list)
    """Wall seconds each micro-step of this cycle spent popping its samples, one per collection."""
    step_wait_samples: list[int] = field(default_factory=list)
    """max(0, required_samples - queue_size_at_collection_start) per collection, parallel to
    step_wait_times: samples that really had to be waited for (not served from backlog)."""
    only_hybrid: bool = False
    """True when there are no standalone replicas (colocated mode): hybrids are the only rollout capacity."""
    last_activate_duration_s: float = 0.0
    """Seconds spent activating this cycle: hybrid weight sync + add + resume + rebalance."""
    last_deactivate_duration_s: float = 0.0
    """Seconds spent deactivating this cycle: remove + abort + sleep (the sample wait excluded)."""
    last_deactivate_wait_s: float = 0.0
    """Seconds the trainer waited for `deactivate_wait_samples` before this cycle's deactivation (the
    hybrid window; 0 without one). Cleared with the durations above."""
    staleness_threshold: float = 0.0
    """async_training.staleness_threshold (static); used for buffer_samples."""
    num_hybrid_replicas: int = 0
    """Hybrid replicas registered with the controller (static; set by the controller core)."""
    num_standalone_replicas: int = 0
    """Standalone replicas registered with the controller (static; set by the controller core)."""
    concurrent_samples_per_replica: int = 0
    """async_training.concurrent_samples_per_replica (static; 0 = not given): samples the rollouter keeps
    in flight per serving replica, up to max_required."""
    hybrid_concurrent_samples_per_replica: int = 0
    """async_training.hybrid_concurrent_samples_per_replica (static; 0 = as a standalone): samples the
    rollouter keeps in flight per active hybrid, within the same max_required."""
    responses_per_sample: int = 1
    """data.n (static): the requests one sample puts on an engine."""
    max_running_requests_per_replica: int = 0
    """rollout.max_num_seqs (static; 0 = not given): one engine's running requests; more wait in it."""
    queue_size: int = -1
    """MessageQueue samples not yet taken by the trainer, read at the sync (-1: the driver did not read it;
    `total_generated - expected` is the seed's estimate of it)."""
    total_samples: int = 0
    """data.total_rollout_steps (static; 0 = not given): the samples the run trains on, so the samples
    still to train are `total_samples - expected_samples`."""
    feed_done: bool = False
    """Every prompt has been fed (read at the sync): no new sample will start, only in-flight ones finish."""
    partial_rollout: bool = True
    """async_training.partial_rollout (static): off, an abort ends the responses it finds where stopped."""
    generating_samples: int = 0
    """Samples taken from the feed and not yet queued, read at the sync (the rollouter's active_tasks)."""
    # ---- measured by the controller core (core/measure.py); 0 = nothing measured yet ----
    standalone_samples_per_replica_s: float = 0.0
    """Samples enqueued per standalone-replica-second while only standalones served (measured, decayed
    average over the controller's progress readings; refreshed at each sync and deactivation)."""
    hybrid_samples_per_replica_s: float = 0.0
    """Extra samples enqueued per hybrid-replica-second while hybrids served: (produced - the standalones'
    measured share) / hybrid replica-seconds, over the hybrid windows so far (0 = never measured)."""
    samples_per_replica_s: float = 0.0
    """Samples enqueued per serving replica-second over whole sync cycles, standalones and hybrids pooled
    (measured, decayed; refreshed at each sync): it credits hybrid work finished on a standalone after
    the hybrid's deactivation, which the two per-window rates above cannot."""
    static_samples_per_replica_s: float = 0.0
    """The same over the sync cycles no hybrid was added in that follow another such cycle, counted from
    the first switch on, each scaled by the trainer's micro-step time then over now (measured, decayed; 0
    until one closed): what the standalones produce alone, which `samples_per_replica_s` under-states where
    lending the GPUs only spreads the same requests over more engines (before any switch, every cycle is
    such a cycle and the pooled rate is this measurement)."""
    hybrid_window_samples_per_s: float = 0.0
    """Samples enqueued per second of hybrid serving, all replicas included: how fast the queue filled
    while the trainer waited with its GPUs lent (measured over the hybrid windows, decayed; 0 = none)."""
    last_hybrid_window_samples_per_s: float = 0.0
    """The same rate for the latest hybrid window alone (what the last activation achieved)."""
    trainer_s_per_micro_step: float = 0.0
    """Seconds from a micro-step's samples being collected to the trainer's next handshake (training,
    ack, export), decayed average: what one micro-step's `required_samples` cost the trainer."""
    decode_load_cost: float = 0.0
    """The part of an engine's decode step that grows with its load (requests in flight, the context they
    hold) over the part that does not, at the load its tokens saw on average (measured: core/measure.py's
    DecodeFit over the finished attempts, decayed per version; 0 = flat or not measured yet). Spreading
    the same load over more engines shrinks that part; the load the tokens saw is below the nominal one
    where a long tail runs nearly alone."""
    handover_on_time_share: float = 1.0
    """Of the samples a hybrid window handed to the standalones (an attempt aborted at its deactivation),
    the share queued before that cycle's sync (measured per window, decayed; 1.0 until a window handed any
    over). Short responses finish in the window's own cycle; long ones mostly in the next."""
    last_switch_overhead_s: float = 0.0
    """Trainer seconds lost to this cycle's switches outside the two durations above: its offload
    before the hybrids woke and its onload after they slept (measured; cleared with them)."""
    step_required_samples: int = field(init=False)
    """Derived once: required_samples x trigger_parameter_sync_step, the samples of one sync cycle."""
    max_required_samples: int = field(init=False)
    """Derived once: int(required x (staleness_threshold + 1) x trigger), the samples one version may
    hold; max_required - step_required is the most that can be carried into the next version."""

    def __post_init__(self) -> None:
        if self.required_samples < 1:
            raise ValueError(f"required_samples must be >= 1, got {self.required_samples}")
        if self.trigger_parameter_sync_step < 1:
            raise ValueError(
                f"trigger_parameter_sync_step must be >= 1, got {self.trigger_parameter_sync_step}")
        if self.staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {self.staleness_threshold}")
        self.step_required_samples = self.required_samples * self.trigger_parameter_sync_step
        self.max_required_samples = int(
            self.required_samples * (self.staleness_threshold + 1) * self.trigger_parameter_sync_step)

    @property
    def samples_per_hybrid(self) -> int:
        """Samples the rollouter keeps in flight per active hybrid (0 when the concurrency is not given)."""
        return self.hybrid_concurrent_samples_per_replica or self.concurrent_samples_per_replica

    def samples_in_flight(self, *, hybrids: int) -> int:
        """Samples the rollouter keeps in flight with the standalones and `hybrids` hybrids serving: their
        share, capped at max_required (as core/flow.py's max_concurrent; 0 when no concurrency is given)."""
        standalones_hold = self.num_standalone_replicas * self.concurrent_samples_per_replica
        return min(standalones_hold + hybrids * self.samples_per_hybrid, self.max_required_samples)

    @property
    def standalone_samples_in_flight(self) -> int:
        """Samples the rollouter keeps in flight with the standalones alone serving: min(standalones x
        concurrent_samples_per_replica, max_required) (0 when the concurrency is not given)."""
        return self.samples_in_flight(hybrids=0)

    def running_requests(self, *, samples: int, replicas: int) -> int:
        """Requests `replicas` engines run at once holding `samples` samples between them (spread evenly,
        each runs at most max_running_requests_per_replica; no cap when that is not given)."""
        requests = samples * self.responses_per_sample
        cap = replicas * self.max_running_requests_per_replica
        return min(requests, cap) if cap > 0 else requests

    @property
    def hybrid_production_gain(self) -> float:
        """Samples the hybrids add per sample the standalones produce alone. More requests in flight (the
        hybrids' own samples, up to the rollouter's max_required and each engine's running cap) produce
        more at the same speed (Little's law); and with the requests spread over more engines each engine
        runs a smaller load, so each request runs faster by (1 + L) / (1 + L r): L = decode_load_cost,
        r = the per-engine load with the hybrids over without (none where nothing carries over: the
        version's samples all start at its sync, on the standalones, before the hybrids wake). 0 where the
        standalones already hold max_required and the step is flat (lent GPUs would only spread the same
        requests); H / S (a hybrid as a standalone) when the concurrency is not given."""
        hybrids, standalones = self.num_hybrid_replicas, self.num_standalone_replicas
        alone = self.running_requests(samples=self.standalone_samples_in_flight, replicas=standalones)
        if alone <= 0 or standalones <= 0 or self.samples_per_hybrid <= 0:
            return hybrids / standalones if standalones > 0 else 0.0
        with_hybrids = self.running_requests(samples=self.samples_in_flight(hybrids=hybrids),
                                             replicas=standalones + hybrids)
        load_ratio = (with_hybrids / (standalones + hybrids)) / (alone / standalones)
        load_cost = self.decode_load_cost if self.carry_over_limit_samples > 0 else 0.0
        speedup = (1.0 + load_cost) / (1.0 + load_cost * load_ratio)
        return max(0.0, with_hybrids / alone * speedup - 1.0)

    @property
    def carry_over_limit_samples(self) -> int:
        """max_required - step_required: samples a version can hand to the next (queued or in flight)."""
        return self.max_required_samples - self.step_required_samples

    @property
    def queued_samples(self) -> int:
        """Samples queued at the sync: `queue_size` as the controller read it, else the seed's estimate
        `total_generated - expected`."""
        if self.queue_size >= 0:
            return self.queue_size
        return self.total_generated_samples - self.expected_samples

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (lists copied), for persistence."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DynamicScheduleContext:
        """Inverse of `to_dict`; the derived step_required_samples is recomputed, unknown keys ignored."""
        init_names = {f.name for f in fields(cls) if f.init}
        return cls(**{k: copy.deepcopy(v) for k, v in data.items() if k in init_names})


def validate_ratio(value: float) -> float:
    """Return `value` as a float if it is a deactivate_ratio in [0, 1], else raise ValueError."""
    ratio = float(value)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"deactivate_ratio must be within [0, 1], got {value!r}")
    return ratio


_SIMPLE = (int, float, str, bool, type(None))


def _is_simple(value: Any) -> bool:
    if isinstance(value, _SIMPLE):
        return True
    if isinstance(value, list | tuple):
        return all(_is_simple(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_simple(v) for k, v in value.items())
    return False


class DynamicSchedulePolicyBase(ABC):
    """Decides when hybrid replicas are deactivated and (re-)activated.

    Call order per training step (driven by the controller core):
      1. should_deactivate()          - at the start of every micro-step.
      2. deactivate_wait_samples()    - only if (1) returned True: queue size to wait for.
      3. should_activate_after_step() - at a sync, decided before any weight sync.
      4. request_rebalance()          - when an activation is planned and rebalance is enabled;
                                        return False to veto the rebalance, None to let it run.
      5. update_after_step()          - after the sync; adapt internal state.

    Subclasses need not call `super().__init__()` (the seed's example does not);
    the helper methods below only use `getattr` with defaults.
    """

    policy_name: ClassVar[str] = ""
    """Set by `register_policy` to the name the class was registered under."""

    def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False):
        """The built-ins' constructor: the ratio is validated to lie in [0, 1], and colocated
        mode (only_hybrid) pins it at 1.0 so every cycle waits for a full step's samples."""
        ratio = validate_ratio(deactivate_ratio)
        self.deactivate_ratio = 1.0 if only_hybrid else ratio
        self.only_hybrid = only_hybrid

    @abstractmethod
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool,
                          ctx: DynamicScheduleContext) -> bool:
        """Return True to deactivate hybrid replicas before this micro-step trains."""

    @abstractmethod
    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """Return the minimum queue size to wait for before deactivation proceeds."""

    @abstractmethod
    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Return True to (re-)activate hybrid replicas at this sync."""

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:  # noqa: B027
        """Adapt internal state after a sync. Default: no-op."""

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Asked when an activation is planned and rebalance is enabled.

        The original called the rollouter here; a pure policy only answers:
        None (the seed's signature returns nothing) lets the controller issue
        the rebalance, False vetoes it. Default: None.
        """
        return None

    # ---- helpers for the admin API and persistence (not part of the seed's API) ----

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot of the instance: every attribute holding simple values (deep-copied)."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if _is_simple(v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore attributes saved by `state_dict`."""
        for key, value in state.items():
            setattr(self, key, copy.deepcopy(value))

    def describe(self) -> dict[str, Any]:
        """Admin view: name, deactivate_ratio, only_hybrid, plus every simple internal attribute."""
        info: dict[str, Any] = {
            "name": self.policy_name or type(self).__name__,
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "deactivate_ratio": getattr(self, "deactivate_ratio", None),
            "only_hybrid": getattr(self, "only_hybrid", False),
        }
        for key, value in self.state_dict().items():
            info.setdefault(key.lstrip("_"), value)
        return info

    def explain_last_decision(self) -> dict[str, Any]:
        """The numbers behind the policy's last decision, for the controller's audit record.

        Default: the policy's `last_decision` attribute if it keeps one, else {} (nothing audited).
        """
        decision = getattr(self, "last_decision", None)
        return dict(decision) if isinstance(decision, dict) else {}

    def set_deactivate_ratio(self, value: float) -> None:
        """Admin override of deactivate_ratio; must lie in [0, 1].

        Colocated mode (only_hybrid) pins the ratio at 1.0: with no standalone
        replicas nothing generates after deactivation, so a smaller wait would
        leave the trainer without samples.
        """
        ratio = validate_ratio(value)
        if getattr(self, "only_hybrid", False) and ratio != 1.0:
            raise ValueError(f"only_hybrid (colocated) mode pins deactivate_ratio at 1.0, got {value!r}")
        self.deactivate_ratio = ratio


_POLICY_REGISTRY: dict[str, type[DynamicSchedulePolicyBase]] = {}

PolicyT = TypeVar("PolicyT", bound=type[DynamicSchedulePolicyBase])


def register_policy(name: str) -> Callable[[PolicyT], PolicyT]:
    """Class decorator: register a policy under `name` (a later registration of the same name wins)."""
    if not name:
        raise ValueError("policy name must be a non-empty string")

    def decorator(cls: PolicyT) -> PolicyT:
        if not (isinstance(cls, type) and issubclass(cls, DynamicSchedulePolicyBase)):
            raise TypeError(
                f"@register_policy({name!r}) needs a DynamicSchedulePolicyBase subclass, got {cls!r}")
        cls.policy_name = name
        _POLICY_REGISTRY[name] = cls
        return cls

    return decorator


def registered_policies() -> list[str]:
    """Sorted names of every registered policy."""
    return sorted(_POLICY_REGISTRY)


def build_policy(name: str, *, deactivate_ratio: float, only_hybrid: bool) -> DynamicSchedulePolicyBase:
    """Instantiate the policy registered as `name`.

    Raises UnknownPolicyError (a KeyError and a ValueError) listing the
    registered names, or ValueError if deactivate_ratio is outside [0, 1].
    """
    cls = _POLICY_REGISTRY.get(name)
    if cls is None:
        raise UnknownPolicyError(
            f"unknown dynamic scheduling policy {name!r}; registered: {', '.join(registered_policies())}"
        )
    ratio = validate_ratio(deactivate_ratio)
    return cls(deactivate_ratio=ratio, only_hybrid=only_hybrid)  # type: ignore[call-arg]


def load_policy_module(module_name: str) -> ModuleType:
    """Import `module_name` (e.g. "my_pkg.my_policy") so its @register_policy decorators run.

    Config lists such modules; importing an already-imported module is a no-op.
    """
    if not module_name:
        raise ValueError("policy module name must be a non-empty string")
    return importlib.import_module(module_name)
