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
the next activation's sync brings the replica up to date. The states and
actions are the wire vocabularies of `shared/vocab.py`.
"""

from __future__ import annotations

from shared.vocab import WEIGHT_ACTIONS, CommandAction, ReplicaState

__all__ = ["WEIGHT_ACTIONS", "IllegalReplicaTransition", "ReplicaState", "transition"]

_A = CommandAction
_S = ReplicaState


class IllegalReplicaTransition(ValueError):
    """A command that is not legal in the replica's current state."""


_TRANSITIONS: dict[tuple[ReplicaState, CommandAction], ReplicaState] = {
    (_S.SLEEPING, _A.WAKE): _S.PAUSED,
    (_S.SLEEPING, _A.SLEEP): _S.SLEEPING,
    (_S.SLEEPING, _A.ABORT): _S.SLEEPING,
    (_S.PAUSED, _A.RESUME): _S.SERVING,
    (_S.PAUSED, _A.ABORT): _S.PAUSED,
    (_S.PAUSED, _A.SLEEP): _S.SLEEPING,
    (_S.PAUSED, _A.WAKE): _S.PAUSED,
    (_S.SERVING, _A.ABORT): _S.PAUSED,
    (_S.SERVING, _A.SLEEP): _S.SLEEPING,
    (_S.SERVING, _A.RESUME): _S.SERVING,
    (_S.SERVING, _A.WAKE): _S.SERVING,
}


def transition(state: ReplicaState, action: CommandAction) -> ReplicaState:
    """The state after `action`, or IllegalReplicaTransition."""
    if action in WEIGHT_ACTIONS:
        if state is ReplicaState.SLEEPING:
            raise IllegalReplicaTransition(f"replica cannot {str(action)!r} while sleeping: wake it first")
        return state
    next_state = _TRANSITIONS.get((state, action))
    if next_state is None:
        legal = sorted(a.value for (s, a) in _TRANSITIONS if s == state)
        legal += [] if state is ReplicaState.SLEEPING else sorted(a.value for a in WEIGHT_ACTIONS)
        raise IllegalReplicaTransition(f"replica cannot {str(action)!r} while {state.value}; legal: {legal}")
    return next_state
