"""The closed vocabularies of the wire protocol: every phase, action, state and reason is one of these.

Where it sits: fields of the messages in `shared/schema.py` (which re-exports
these names) are typed with them; on the wire each travels as its plain string
value and is parsed back on decode, so an unknown value is a MalformedMessage,
and mypy checks every comparison. Hash field names and sample states are in
`shared/names.py`.
"""

from __future__ import annotations

from enum import StrEnum


class TrainerPhase(StrEnum):
    """Trainer -> controller: where the trainer is in its cycle (TrainerEvent.phase)."""

    MICRO_STEP_START = "micro_step_start"
    """About to collect a micro-step's samples; waits for GPUS_READY."""
    COLLECTED = "collected"
    """The micro-step's samples were popped (wait time and samples missing at start)."""
    MICRO_STEP_DONE = "micro_step_done"
    """Trained; carries the micro-step's timings and stats."""
    WEIGHTS_READY = "weights_ready"
    """A new version is exported; waits for SYNC_DONE."""
    DONE = "done"
    """Every step trained; the run is over."""


class TrainerAction(StrEnum):
    """Controller -> trainer: the answer to a handshake phase (TrainerReply.action)."""

    GPUS_READY = "gpus_ready"
    """Answers MICRO_STEP_START: train now, no hybrid holds the trainer's GPUs."""
    SYNC_DONE = "sync_done"
    """Answers WEIGHTS_READY: every serving replica has the new version; go on."""


class CommandAction(StrEnum):
    """Controller (or trainer, for pushes) -> worker / LB / rollouter / trainer (Command.action)."""

    # rollout worker
    ABORT = "abort"
    RESUME = "resume"
    SLEEP = "sleep"
    WAKE = "wake"
    UPDATE_WEIGHTS = "update_weights"
    """Reload a version from the filesystem."""
    WEIGHTS_INIT = "weights_init"
    WEIGHTS_START = "weights_start"
    WEIGHTS_UPDATE = "weights_update"
    WEIGHTS_FINISH = "weights_finish"
    # load balancer
    ADD = "add"
    REMOVE = "remove"
    CLEAR_STICKY = "clear_sticky"
    INFLIGHT = "inflight"
    # rollouter
    SET_ACTIVE_REPLICAS = "set_active_replicas"
    RESET_STALENESS = "reset_staleness"
    # trainer (served while it waits for SYNC_DONE)
    RELEASE_GPUS = "release_gpus"
    """Offload: hybrids are about to wake on the trainer's GPUs."""
    ACQUIRE_GPUS = "acquire_gpus"
    """Onload while the hybrids sleep (dynamic_schedule_overlap_sleep), before GPUS_READY."""
    SYNC_WEIGHTS = "sync_weights"
    """Bring replicas to a version (push, per push group; else, or for a failed push's replicas, the
    filesystem); acked with a WeightSyncReport."""


WEIGHT_ACTIONS = frozenset({CommandAction.UPDATE_WEIGHTS, CommandAction.WEIGHTS_INIT,
                            CommandAction.WEIGHTS_START,
                            CommandAction.WEIGHTS_UPDATE, CommandAction.WEIGHTS_FINISH})
"""The worker actions that load weights: legal while awake, refused while SLEEPING (core/replica.py);
the replica's lifecycle state is unchanged."""


class PushStep(StrEnum):
    """One step of a trainer-driven weight push: vLLM's four weight-sync calls, in this order
    (the engine's `transfer` step; on the wire, the worker command of PUSH_ACTIONS)."""

    INIT = "init"
    """Join the trainer's transfer group."""
    START = "start"
    UPDATE = "update"
    """Receive one chunk of weights."""
    FINISH = "finish"


PUSH_ACTIONS = {PushStep.INIT: CommandAction.WEIGHTS_INIT, PushStep.START: CommandAction.WEIGHTS_START,
                PushStep.UPDATE: CommandAction.WEIGHTS_UPDATE, PushStep.FINISH: CommandAction.WEIGHTS_FINISH}
"""The worker command that carries each push step."""


class ReplicaState(StrEnum):
    """A rollout replica's lifecycle state (the transitions: core/replica.py)."""

    SLEEPING = "sleeping"
    PAUSED = "paused"
    SERVING = "serving"


class FinishReason(StrEnum):
    """Why one generation attempt ended (GenerateResult.finish_reason, Trajectory.finish_reason)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    """Partial: aborted mid-generation, resumed elsewhere."""
    REJECTED = "rejected"
    """The replica was not serving; retried elsewhere."""
    ERROR = "error"
    """The engine raised on this attempt (the worker logs why); retried, and a trajectory whose engine
    fails `MAX_ENGINE_ERRORS` times (core/sample_progress.py) ends truncated with this reason."""


FINISHED = frozenset({FinishReason.STOP, FinishReason.LENGTH})
"""A trajectory with one of these is complete; the others are retried."""


class AuditKind(StrEnum):
    """What an AuditEvent records."""

    REPLICA_STATE = "replica_state"
    SWITCH = "switch"
    PHASE = "phase"
    COMMAND = "command"
    PUSH = "push"
    LB = "lb"
    DROP = "drop"
    DECISION = "decision"
    """A policy's decision with the numbers it compared (AuditEvent.decision)."""


class AuditPhase(StrEnum):
    """AuditEvent.phase of a PHASE event."""

    TRAIN_START = "train_start"
    """The trainer starts computing a micro-step (it holds its GPUs)."""
    TRAIN_END = "train_end"
    RUN_DONE = "run_done"


class LaneState(StrEnum):
    """What a GPU lane (a replica's GPUs, the trainer's) does at a time: the categories of the
    resource-time charts, drawn from the simulator's timeline (sim/result.py) and from a run's audit
    events (services/report.py). Not on the wire."""

    ROLLOUT = "rollout"
    """Generating."""
    TRAIN = "train"
    """The trainer computing (hybrid lanes too: their GPUs are the trainer's)."""
    SYNC = "sync"
    """Loading a new weight version."""
    SWITCH = "switch"
    """Sleeping, waking, or awake but not serving."""
    IDLE = "idle"
