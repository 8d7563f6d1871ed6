"""The hybrid-replica lifecycle: one state machine, pure (no I/O, no clock).

Where it sits: `policies <- core <- services, sim`. The controller service (or
the simulator) feeds `ControllerCore` events, executes the returned commands
*in order*, then reports completion; so one object drives real replicas and a
virtual clock, and its state is a plain dict persisted after every call.

State machine (Mode), one bool in the original plus two transitional states so
that a crash in the middle of a switch is recoverable: a restored core in a
transitional state re-issues the idempotent commands of the call in progress
(`recovery_commands`).

                    begin_sync (activate)              finish_activate
    STANDALONE_ONLY ---------------------> ACTIVATING -----------------> HYBRID_ACTIVE
          ^                                                                    |
          |  finish_deactivate                       begin_micro_step          |
          +------------------------ DEACTIVATING <-----------------------------+

Per sync cycle (reference 1.3, seed's five-step policy order):

    begin_micro_step  -> 1 should_deactivate, 2 deactivate_wait_samples
                         [WaitForSamples, RemoveReplicas, AbortReplicas, SleepReplicas]
    finish_deactivate
    record_collection    (once per micro-step, after the samples were popped)
    ... trigger_parameter_sync_step micro-steps ...
    begin_sync        -> 3 should_activate_after_step (before any sync), 4 request_rebalance
                         [SyncWeights(standalones), WakeReplicas, SyncWeights(hybrids),
                          AddReplicas, ResumeReplicas, Rebalance, ResetStaleness]
                         fold_hybrid_sync: [WakeReplicas, SyncWeights(standalones + hybrids),
                          AddReplicas, ResumeReplicas, Rebalance, ResetStaleness]
    finish_activate      (only when begin_sync left the core ACTIVATING)
    finish_sync       -> 5 update_after_step; per-cycle durations and wait lists cleared

Rules beyond the original (why: see docs/scheduling.md):
- Trainer never computes on GPUs hybrids hold: active hybrids are deactivated at
  every micro-step, with WaitForSamples(0) when the policy says False.
- Colocated mode (no standalones): every sync activates and every deactivation
  waits for step_required_samples, whatever the policy says (else: stall).
- Hybrids still active at a sync are synced too: one version everywhere.
- Zero hybrids: no commands, but mode and counters are still tracked.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from core.commands import (
    COMMAND_TYPES,
    AbortReplicas,
    AddReplicas,
    Command,
    Rebalance,
    RemoveReplicas,
    ResetStaleness,
    ResumeReplicas,
    SleepReplicas,
    SyncWeights,
    WaitForSamples,
    WakeReplicas,
    command_from_dict,
    command_to_dict,
)
from policies import DynamicScheduleContext, DynamicSchedulePolicyBase

__all__ = ["COMMAND_TYPES", "AbortReplicas", "AddReplicas", "Command", "ControllerCore",
           "IllegalTransitionError", "Mode", "Rebalance", "RemoveReplicas", "ResetStaleness",
           "ResumeReplicas", "SleepReplicas", "SyncWeights", "WaitForSamples", "WakeReplicas",
           "check_transition", "command_from_dict", "command_to_dict"]


class Mode(StrEnum):
    """Lifecycle state of the hybrid replicas."""

    STANDALONE_ONLY = "standalone_only"
    DEACTIVATING = "deactivating"
    HYBRID_ACTIVE = "hybrid_active"
    ACTIVATING = "activating"


TRANSITIONS: dict[Mode, frozenset[Mode]] = {
    Mode.STANDALONE_ONLY: frozenset({Mode.ACTIVATING}),
    Mode.ACTIVATING: frozenset({Mode.HYBRID_ACTIVE}),
    Mode.HYBRID_ACTIVE: frozenset({Mode.DEACTIVATING}),
    Mode.DEACTIVATING: frozenset({Mode.STANDALONE_ONLY}),
}
"""Every legal move; `check_transition` is the only place that consults it."""


MEASURED_FIELDS = ("standalone_samples_per_replica_s", "hybrid_samples_per_replica_s",
                   "samples_per_replica_s", "static_samples_per_replica_s", "hybrid_window_samples_per_s",
                   "last_hybrid_window_samples_per_s", "trainer_s_per_micro_step", "decode_load_cost",
                   "handover_on_time_share")
"""The context fields the controller fills from its measurements (`record_measurements`)."""


class IllegalTransitionError(RuntimeError):
    """A call arrived in a state where it is not allowed (a caller bug, never retried)."""


def check_transition(current: Mode, target: Mode) -> Mode:
    """Return `target` if current -> target is in TRANSITIONS, else raise IllegalTransitionError."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(f"illegal mode transition {current.value} -> {target.value}")
    return target


class ControllerCore:
    """Owns the policy, the context and the mode; returns ordered commands, never executes them."""

    def __init__(
        self,
        *,
        policy: DynamicSchedulePolicyBase,
        ctx: DynamicScheduleContext,
        hybrid_ids: tuple[str, ...],
        standalone_ids: tuple[str, ...],
        enable_rebalance: bool = True,
        fold_hybrid_sync: bool = False,
    ):
        if not hybrid_ids and not standalone_ids:
            raise ValueError("need at least one hybrid or standalone replica")
        if ctx.only_hybrid != (not standalone_ids):
            raise ValueError(
                f"ctx.only_hybrid={ctx.only_hybrid} but {len(standalone_ids)} standalone replicas")
        self.policy = policy
        self.ctx = ctx
        self.hybrid_ids = tuple(hybrid_ids)
        self.standalone_ids = tuple(standalone_ids)
        self.enable_rebalance = enable_rebalance
        self.fold_hybrid_sync = fold_hybrid_sync
        """Activation wakes the hybrids first and syncs them in the standalones' sync (one SyncWeights
        over every replica) instead of after it: the hybrid sync leaves the critical path."""
        ctx.num_hybrid_replicas = len(self.hybrid_ids)
        ctx.num_standalone_replicas = len(self.standalone_ids)
        self.mode = Mode.STANDALONE_ONLY
        self.in_sync = False
        self.activations = 0
        self.deactivations = 0
        self.pending_force: bool | None = None
        self._in_flight: list[Command] = []

    # ---- micro-step: seed steps 1-2 ----

    def begin_micro_step(self, global_steps: int) -> list[Command]:
        """Start of a trainer micro-step; returns the deactivation commands, or [] if none."""
        self._require(not self.in_sync, "begin_micro_step during a sync")
        self._require(self.mode in (Mode.STANDALONE_ONLY, Mode.HYBRID_ACTIVE),
                      f"begin_micro_step in {self.mode}")
        active = self.mode is Mode.HYBRID_ACTIVE
        wants = self.policy.should_deactivate(global_steps, active, self.ctx)
        forced = self.pending_force is False
        if forced:
            self.pending_force = None
        if not active:
            return []
        # Invariant: hybrids never keep trainer GPUs into a micro-step, so "False" means "wait 0".
        wait = self.policy.deactivate_wait_samples(self.ctx) if wants and not forced else 0
        if self.ctx.only_hybrid:
            wait = max(wait, self.ctx.step_required_samples)
        self.mode = check_transition(self.mode, Mode.DEACTIVATING)
        if not self.hybrid_ids:
            self.finish_deactivate(0.0)
            return []
        h = self.hybrid_ids
        self._in_flight = [
            WaitForSamples(min_queue_size=max(0, int(wait))),
            RemoveReplicas(replica_ids=h),
            AbortReplicas(replica_ids=h),
            SleepReplicas(replica_ids=h),
        ]
        return list(self._in_flight)

    def finish_deactivate(self, duration_s: float, *, wait_s: float = 0.0) -> None:
        """The deactivation commands ran; `duration_s` (remove+abort+sleep, no wait) and `wait_s` (the
        WaitForSamples before them) are added to ctx."""
        self._require(self.mode is Mode.DEACTIVATING, f"finish_deactivate in {self.mode}")
        self.ctx.last_deactivate_duration_s += _non_negative(duration_s, "duration_s")
        self.ctx.last_deactivate_wait_s += _non_negative(wait_s, "wait_s")
        self.mode = check_transition(self.mode, Mode.STANDALONE_ONLY)
        self.deactivations += 1
        self._in_flight = []

    def record_collection(self, *, wait_time_s: float, wait_samples: int) -> None:
        """A micro-step popped its samples: `wait_time_s` it took, `wait_samples` = max(0, required - q0)."""
        self._require(not self.in_sync, "record_collection during a sync")
        self._require(self.mode is Mode.STANDALONE_ONLY, f"record_collection in {self.mode}")
        self.ctx.step_wait_times.append(_non_negative(wait_time_s, "wait_time_s"))
        self.ctx.step_wait_samples.append(int(_non_negative(wait_samples, "wait_samples")))

    # ---- sync: seed steps 3-5 ----

    def begin_sync(
        self, *, global_steps: int, version: int, total_generated_samples: int, completed_steps: int,
        queue_size: int = -1, feed_done: bool = False, generating_samples: int = 0,
    ) -> list[Command]:
        """Weights `version` are ready; returns the sync (and maybe activation) commands."""
        self._require(not self.in_sync, "begin_sync during a sync")
        self._require(self.mode in (Mode.STANDALONE_ONLY, Mode.HYBRID_ACTIVE), f"begin_sync in {self.mode}")
        ctx = self.ctx
        ctx.total_generated_samples = total_generated_samples
        ctx.expected_samples = ctx.step_required_samples * completed_steps
        ctx.buffer_samples = int(ctx.step_required_samples * ctx.staleness_threshold)
        ctx.queue_size, ctx.feed_done, ctx.generating_samples = queue_size, feed_done, generating_samples
        active = self.mode is Mode.HYBRID_ACTIVE
        # Decided before any sync, so a skipped activation also skips the hybrid weight sync.
        policy_says = self.policy.should_activate_after_step(global_steps, active, ctx)
        forced = self.pending_force is True
        if forced:
            self.pending_force = None
        activate = bool(policy_says) or forced or ctx.only_hybrid
        self.in_sync = True
        commands: list[Command] = []
        fold = activate and not active and self.fold_hybrid_sync and bool(self.hybrid_ids)
        if self.standalone_ids and not fold:
            commands.append(SyncWeights(replica_ids=self.standalone_ids, version=version))
        if active:
            if self.hybrid_ids:
                commands.append(SyncWeights(replica_ids=self.hybrid_ids, version=version))
        elif activate:
            commands += self._activate_commands(global_steps, version, fold=fold)
        commands.append(ResetStaleness(version=version))
        self._in_flight = list(commands)
        return commands

    def _activate_commands(self, global_steps: int, version: int, *, fold: bool) -> list[Command]:
        self.mode = check_transition(self.mode, Mode.ACTIVATING)
        if not self.hybrid_ids:
            self.finish_activate(0.0)
            return []
        h = self.hybrid_ids
        # Folded: the hybrids wake first and join the standalones' sync (every replica at `version`
        # when it ends, as in the seed order); else the seed's order, hybrid sync after the standalones'.
        synced = self.standalone_ids + h if fold else h
        commands: list[Command] = [
            WakeReplicas(replica_ids=h),
            SyncWeights(replica_ids=synced, version=version),
            AddReplicas(replica_ids=h),
            ResumeReplicas(replica_ids=h),
        ]
        if self.enable_rebalance and self.policy.request_rebalance(global_steps, self.ctx) is not False:
            commands.append(Rebalance())
        return commands

    def finish_activate(self, duration_s: float) -> None:
        """Hybrids are synced, added and resumed; `duration_s` is added to ctx.last_activate_duration_s."""
        self._require(self.mode is Mode.ACTIVATING, f"finish_activate in {self.mode}")
        self.ctx.last_activate_duration_s += _non_negative(duration_s, "duration_s")
        self.mode = check_transition(self.mode, Mode.HYBRID_ACTIVE)
        self.activations += 1

    def finish_sync(self, global_steps: int) -> None:
        """Every sync command ran: the policy adapts, then the cycle's durations and waits are cleared."""
        self._require(self.in_sync, "finish_sync without begin_sync")
        self._require(self.mode is not Mode.ACTIVATING, "finish_sync before finish_activate")
        self.policy.update_after_step(global_steps, self.ctx)
        self.ctx.last_activate_duration_s = 0.0
        self.ctx.last_deactivate_duration_s = 0.0
        self.ctx.last_deactivate_wait_s = 0.0
        self.ctx.last_switch_overhead_s = 0.0
        self.ctx.step_wait_times.clear()
        self.ctx.step_wait_samples.clear()
        self.in_sync = False
        self._in_flight = []

    def record_measurements(self, **measured: float) -> None:
        """The executor's measurements (core.measure) into the context fields of the same names."""
        for name, value in measured.items():
            if name not in MEASURED_FIELDS:
                raise ValueError(f"{name!r} is not a measured context field ({', '.join(MEASURED_FIELDS)})")
            setattr(self.ctx, name, _non_negative(value, name))

    def record_switch_overhead(self, duration_s: float) -> None:
        """Trainer time a switch cost outside the switch commands (offload before a wake, onload after
        a sleep); summed into ctx.last_switch_overhead_s for this cycle."""
        self.ctx.last_switch_overhead_s += _non_negative(duration_s, "duration_s")

    def force(self, activate: bool) -> None:
        """Admin request, applied at the next safe point through the normal ordering.

        activate=True: the next sync activates whatever the policy says.
        activate=False: the next micro-step deactivates without waiting for samples
        (colocated mode still waits for a full cycle); a no-op if hybrids are inactive.
        A newer request replaces an older one.
        """
        self.pending_force = bool(activate)

    def describe(self) -> dict[str, Any]:
        """Admin view of the controller and its policy."""
        counts = {"num_hybrid_replicas": len(self.hybrid_ids),
                  "num_standalone_replicas": len(self.standalone_ids)}
        return {**self._status(), **counts, "policy": self.policy.describe()}

    def _status(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "in_sync": self.in_sync,
            "activations": self.activations,
            "deactivations": self.deactivations,
            "pending_force": self.pending_force,
        }

    def recovery_commands(self) -> list[Command]:
        """Commands of the call that was in progress when the snapshot was taken ([] if none).

        All of them are idempotent, so after a crash the caller re-executes them
        and then makes the matching finish_* call(s).
        """
        return list(self._in_flight)

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-ready plain data (policy state included)."""
        return {
            **self._status(),
            "hybrid_ids": list(self.hybrid_ids),
            "standalone_ids": list(self.standalone_ids),
            "enable_rebalance": self.enable_rebalance,
            "fold_hybrid_sync": self.fold_hybrid_sync,
            "in_flight": [command_to_dict(c) for c in self._in_flight],
            "ctx": self.ctx.to_dict(),
            "policy": {"name": self.policy.policy_name, "state": self.policy.state_dict()},
        }

    @classmethod
    def restore(cls, data: dict[str, Any], *, policy: DynamicSchedulePolicyBase) -> ControllerCore:
        """Rebuild a core from `snapshot()` output around a freshly built `policy`.

        The policy's saved state is loaded only if it was saved under the same
        policy name; a config that switched policies starts the new one fresh.
        """
        core = cls(
            policy=policy,
            ctx=DynamicScheduleContext.from_dict(data["ctx"]),
            hybrid_ids=tuple(data["hybrid_ids"]),
            standalone_ids=tuple(data["standalone_ids"]),
            enable_rebalance=bool(data["enable_rebalance"]),
            fold_hybrid_sync=bool(data.get("fold_hybrid_sync", False)),
        )
        core.mode = Mode(data["mode"])
        core.in_sync = bool(data["in_sync"])
        core.activations, core.deactivations = int(data["activations"]), int(data["deactivations"])
        core.pending_force = data["pending_force"]
        core._in_flight = [command_from_dict(c) for c in data["in_flight"]]
        saved = data["policy"]
        if saved["name"] == policy.policy_name:
            policy.load_state_dict(saved["state"])
        return core

    @staticmethod
    def _require(condition: bool, what: str) -> None:
        if not condition:
            raise IllegalTransitionError(f"illegal call order: {what}")


def _non_negative(value: float, name: str) -> float:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)
