"""Lifecycle of one rollout replica (engine), as seen by its rollout-worker.

Where it sits: the rollout-worker applies controller commands through
`transition`, so an illegal command order (e.g. resume while asleep) is
rejected with a clear error instead of leaving the engine half-switched.

    SLEEPING --wake--> PAUSED --resume--> SERVING
       ^                 |  ^                |
       |                 |  +----abort-------+
       +-----sleep-------+-------sleep-------+   (sleep from SERVING aborts first)

Only SERVING accepts generation requests; a request reaching a PAUSED or
SLEEPING replica is rejected at once (never parked), so the rollouter retries
it and the load balancer routes it elsewhere. `update_weights` and the push
steps are legal while awake (PAUSED, SERVING) and leave the state unchanged (a
SERVING replica aborts, loads and keeps serving). A SLEEPING replica refuses
them: its weights are offloaded (vLLM sleep level 1), so loading would write
into unmapped memory. The controller always wakes before it syncs; a weight
command that reaches a sleeping replica is one replayed after a restart, and
the next activation's sync brings the replica up to date.
"""

from __future__ import annotations

from enum import StrEnum


class ReplicaState(StrEnum):
    SLEEPING = "sleeping"
    PAUSED = "paused"
    SERVING = "serving"


class IllegalReplicaTransition(ValueError):
    """A command that is not legal in the replica's current state."""


WEIGHT_ACTIONS = frozenset({"update_weights", "weights_init", "weights_start", "weights_update", "weights_finish"})
"""Weight loading, legal while awake; the replica's state is unchanged."""

_TRANSITIONS: dict[tuple[ReplicaState, str], ReplicaState] = {
    (ReplicaState.SLEEPING, "wake"): ReplicaState.PAUSED,
    (ReplicaState.SLEEPING, "sleep"): ReplicaState.SLEEPING,
    (ReplicaState.SLEEPING, "abort"): ReplicaState.SLEEPING,
    (ReplicaState.PAUSED, "resume"): ReplicaState.SERVING,
    (ReplicaState.PAUSED, "abort"): ReplicaState.PAUSED,
    (ReplicaState.PAUSED, "sleep"): ReplicaState.SLEEPING,
    (ReplicaState.PAUSED, "wake"): ReplicaState.PAUSED,
    (ReplicaState.SERVING, "abort"): ReplicaState.PAUSED,
    (ReplicaState.SERVING, "sleep"): ReplicaState.SLEEPING,
    (ReplicaState.SERVING, "resume"): ReplicaState.SERVING,
    (ReplicaState.SERVING, "wake"): ReplicaState.SERVING,
}


def transition(state: ReplicaState, action: str) -> ReplicaState:
    """The state after `action`, or IllegalReplicaTransition."""
    if action in WEIGHT_ACTIONS:
        if state is ReplicaState.SLEEPING:
            raise IllegalReplicaTransition(f"replica cannot {action!r} while sleeping: wake it first")
        return state
    next_state = _TRANSITIONS.get((state, action))
    if next_state is None:
        legal = sorted(a for (s, a) in _TRANSITIONS if s == state)
        legal += [] if state is ReplicaState.SLEEPING else sorted(WEIGHT_ACTIONS)
        raise IllegalReplicaTransition(f"replica cannot {action!r} while {state.value}; legal: {legal}")
    return next_state
