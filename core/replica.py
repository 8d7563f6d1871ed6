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
it and the load balancer routes it elsewhere. `update_weights` is legal in
every state and leaves the state unchanged (a SERVING replica aborts, loads
and keeps serving).
"""

from __future__ import annotations

from enum import StrEnum

from shared.schema import WEIGHT_ACTIONS, CommandAction


class ReplicaState(StrEnum):
    SLEEPING = "sleeping"
    PAUSED = "paused"
    SERVING = "serving"


class IllegalReplicaTransition(ValueError):
    """A command that is not legal in the replica's current state."""


_TRANSITIONS: dict[tuple[ReplicaState, str], ReplicaState] = {  # weight loading (WEIGHT_ACTIONS): any state
    (ReplicaState.SLEEPING, CommandAction.WAKE): ReplicaState.PAUSED,
    (ReplicaState.SLEEPING, CommandAction.SLEEP): ReplicaState.SLEEPING,
    (ReplicaState.SLEEPING, CommandAction.ABORT): ReplicaState.SLEEPING,
    (ReplicaState.PAUSED, CommandAction.RESUME): ReplicaState.SERVING,
    (ReplicaState.PAUSED, CommandAction.ABORT): ReplicaState.PAUSED,
    (ReplicaState.PAUSED, CommandAction.SLEEP): ReplicaState.SLEEPING,
    (ReplicaState.PAUSED, CommandAction.WAKE): ReplicaState.PAUSED,
    (ReplicaState.SERVING, CommandAction.ABORT): ReplicaState.PAUSED,
    (ReplicaState.SERVING, CommandAction.SLEEP): ReplicaState.SLEEPING,
    (ReplicaState.SERVING, CommandAction.RESUME): ReplicaState.SERVING,
    (ReplicaState.SERVING, CommandAction.WAKE): ReplicaState.SERVING,
}


def transition(state: ReplicaState, action: str) -> ReplicaState:
    """The state after `action`, or IllegalReplicaTransition."""
    if action in WEIGHT_ACTIONS:  # legal in every state; the replica's state is unchanged
        return state
    next_state = _TRANSITIONS.get((state, action))
    if next_state is None:
        legal = sorted(a for (s, a) in _TRANSITIONS if s == state) + sorted(WEIGHT_ACTIONS)
        raise IllegalReplicaTransition(f"replica cannot {action!r} while {state.value}; legal: {legal}")
    return next_state
