"""Every message that crosses a Redis stream, and the one encode/decode pair.

Where it sits: services build these dataclasses and call `encode` before XADD,
`decode` after XREAD. Nothing else touches stream field encoding
(STYLE.md rule 1).

Wire format: scalar fields (str, int, float, bool) are plain string fields so
`redis-cli XRANGE` is readable; everything bulky or nested (token ids,
logprobs, trajectories, metric dicts) goes into one msgpack field `payload`.
Every message carries a `type` tag. A malformed entry raises
`MalformedMessage` (a ValueError) naming the entry's problem; the reading
service dead-letters it, it never crashes the loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import msgpack

PAYLOAD_FIELD = "payload"
TYPE_FIELD = "type"
_SCALARS = (str, int, float, bool)


class MalformedMessage(ValueError):
    """A stream entry that cannot be decoded into a known message."""


# ---- closed vocabularies: every phase, action and reason on the wire is one of these ----


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
    """Controller (or trainer, for pushes) -> worker / load balancer / rollouter / trainer (Command.action)."""

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
    SYNC_WEIGHTS = "sync_weights"
    """Bring replicas to a version (push, else or on failure the filesystem); acked with a WeightSyncReport."""


WEIGHT_ACTIONS = frozenset({CommandAction.UPDATE_WEIGHTS, CommandAction.WEIGHTS_INIT, CommandAction.WEIGHTS_START,
                            CommandAction.WEIGHTS_UPDATE, CommandAction.WEIGHTS_FINISH})
"""The worker actions that load weights (the replica's lifecycle state is unchanged)."""


class FinishReason(StrEnum):
    """Why one generation attempt ended (GenerateResult.finish_reason, Trajectory.finish_reason)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    """Partial: aborted mid-generation, resumed elsewhere."""
    REJECTED = "rejected"
    """The replica was not serving; retried elsewhere."""


class AuditKind(StrEnum):
    """What an AuditEvent records."""

    REPLICA_STATE = "replica_state"
    SWITCH = "switch"
    PHASE = "phase"
    COMMAND = "command"
    PUSH = "push"
    LB = "lb"
    DROP = "drop"


@dataclass(frozen=True, slots=True, kw_only=True)
class Trajectory:
    """One response to a prompt: one LLM request, maybe resumed across aborts."""

    request_id: str
    """Stable id `{sample_id}/{index}`; the same across retries (sticky routing)."""
    response_token_ids: list[int]
    response_logprobs: list[float]
    """Log-probability of each sampled token under the weights that generated it."""
    finish_reason: str
    """'stop' or 'length' once finished."""
    reward: float = 0.0
    min_version: int = 0
    """Weight version of the first attempt."""
    max_version: int = 0
    """Weight version of the last attempt (differs from min after a cross-sync resume)."""
    num_attempts: int = 1
    """1 + number of aborts it survived."""
    replica_ids: list[str] = field(default_factory=list)
    """Replicas that generated parts of it, in order."""
    generation_time_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One prompt with its `n` trajectories: the unit of the MessageQueue."""

    type: ClassVar[str] = "sample"
    sample_id: str
    """Stable id `sample_{epoch}_{index}` given when the prompt was fed."""
    prompt_token_ids: list[int]
    answer: str
    """Ground truth used by the reward."""
    trajectories: list[Trajectory]
    enqueued_at: float = 0.0
    """Unix time of the XADD to the MessageQueue."""

    @property
    def min_version(self) -> int:
        return min(t.min_version for t in self.trajectories)

    @property
    def max_version(self) -> int:
        return max(t.max_version for t in self.trajectories)


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """Rollouter -> load balancer -> one worker: generate (or continue) one trajectory."""

    type: ClassVar[str] = "generate"
    request_id: str
    sample_id: str
    prompt_token_ids: list[int]
    """Prompt plus the tokens generated so far when resuming a partial rollout."""
    max_tokens: int
    """Remaining budget: original max minus tokens already generated."""
    attempt: int = 0
    replica_id: str = ""
    """Empty from the rollouter; set by the load balancer when routed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateResult:
    """Worker -> load balancer -> rollouter: new tokens of one attempt."""

    type: ClassVar[str] = "result"
    request_id: str
    sample_id: str
    replica_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """'stop', 'length', 'abort' (partial, retry) or 'rejected' (replica not serving; retry)."""
    weight_version: int
    attempt: int = 0
    """Echo of the request's attempt, so a late duplicate of an old attempt is ignored."""
    generation_time_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """Controller -> worker / load balancer / rollouter: one idempotent action."""

    type: ClassVar[str] = "command"
    command_id: str
    action: str
    """Worker: abort, resume, sleep, wake, update_weights (filesystem), and the steps of a weight
    push the trainer drives: weights_init, weights_start, weights_update, weights_finish. LB: add,
    remove, clear_sticky, inflight. Rollouter: set_active_replicas, reset_staleness. Trainer:
    release_gpus, sync_weights."""
    replica_ids: list[str] = field(default_factory=list)
    version: int = -1
    weights_path: str = ""
    value: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    """weights_init / weights_update: vLLM's init / update info for this replica."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAck:
    """Reply to a Command, matched by command_id."""

    type: ClassVar[str] = "ack"
    command_id: str
    sender: str
    ok: bool
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerEvent:
    """Trainer -> controller step-phase event (core.trainer_cycle sends them in order)."""

    type: ClassVar[str] = "trainer_event"
    phase: TrainerPhase
    global_steps: int
    version: int
    weights_path: str = ""
    """WEIGHTS_READY: where the exported version lies ('' when the backend exports none)."""
    wait_time_s: float = 0.0
    """COLLECTED: seconds the micro-step waited for its samples."""
    wait_samples: int = 0
    """COLLECTED: samples missing when the collection started (max(0, required - mq_size))."""
    stats: dict[str, float] = field(default_factory=dict)
    """MICRO_STEP_DONE: the micro-step's metrics, by the seed's metric names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerReply:
    """Controller -> trainer: the answer to MICRO_STEP_START or WEIGHTS_READY."""

    type: ClassVar[str] = "trainer_reply"
    action: TrainerAction
    global_steps: int
    wait_for_enough_samples_s: float = 0.0
    """GPUS_READY: seconds the deactivation waited for samples."""
    deactivate_s: float = 0.0
    """GPUS_READY: seconds spent removing, aborting and sleeping the hybrids."""
    activated: bool = False
    """SYNC_DONE: this sync activated the hybrids."""
    param_sync_s: float = 0.0
    """SYNC_DONE: seconds of the standalone sync plus the activation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightSyncReport:
    """The trainer's one result for a SYNC_WEIGHTS command (its CommandAck's data, as a plain dict).
    `pushed`: a push over `transport` was tried (all replicas alive and on that transport);
    `ok` False: it failed with `error`, and every replica reloaded the version from the filesystem."""

    replica_ids: list[str]
    version: int
    transport: str = ""
    pushed: bool = False
    ok: bool = True
    error: str = ""
    push_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """Lifecycle record for tests, charts and humans (the resource-time chart is drawn from these)."""

    type: ClassVar[str] = "audit"
    kind: str
    """replica_state, switch, phase, sync, drop, ..."""
    subject: str
    """Replica id, 'trainer', 'controller', ..."""
    detail: str
    t: float
    version: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleMetrics:
    """Controller -> `metrics` stream: one sync cycle's metrics under the seed's names."""

    type: ClassVar[str] = "cycle_metrics"
    version: int
    global_steps: int
    t: float
    metrics: dict[str, float] = field(default_factory=dict)


Message = CycleMetrics | Sample | GenerateRequest | GenerateResult | Command | CommandAck | TrainerEvent | TrainerReply | AuditEvent
_MESSAGE_TYPES: dict[str, type] = {
    cls.type: cls
    for cls in (CycleMetrics, Sample, GenerateRequest, GenerateResult, Command, CommandAck, TrainerEvent, TrainerReply, AuditEvent)
}
M = TypeVar("M")


_ENUMS: dict[str, type[StrEnum]] = {
    cls.__name__: cls for cls in (TrainerPhase, TrainerAction, CommandAction, FinishReason, AuditKind)
}
"""Enum-typed fields travel as their plain string value and are parsed back on decode."""


def _is_scalar_field(f: dataclasses.Field[Any]) -> bool:
    return f.type in ("str", "int", "float", "bool") or f.type in _ENUMS


def encode(message: Message) -> dict[Any, Any]:
    """Dataclass -> stream fields: scalars as strings, the rest in one msgpack payload."""
    fields: dict[Any, Any] = {TYPE_FIELD: message.type}
    payload: dict[str, Any] = {}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if _is_scalar_field(f):
            fields[f.name] = str(int(value)) if isinstance(value, bool) else str(value)  # StrEnum: its value
        else:
            payload[f.name] = _to_plain(value)
    if payload:
        fields[PAYLOAD_FIELD] = msgpack.packb(payload, use_bin_type=True)
    return fields


def decode(raw: dict[Any, Any]) -> Message:
    """Stream fields -> dataclass. Raises MalformedMessage on anything unexpected."""
    fields = {_text(k): v for k, v in raw.items()}
    type_tag = _text(fields.get(TYPE_FIELD, b""))
    cls = _MESSAGE_TYPES.get(type_tag)
    if cls is None:
        raise MalformedMessage(f"unknown message type {type_tag!r}; known: {sorted(_MESSAGE_TYPES)}")
    try:
        payload = msgpack.unpackb(fields[PAYLOAD_FIELD], raw=False) if PAYLOAD_FIELD in fields else {}
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise MalformedMessage(f"{type_tag}: payload is not valid msgpack ({exc})") from exc
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _is_scalar_field(f):
            if f.name in fields:
                kwargs[f.name] = _parse_scalar(type_tag, f, _text(fields[f.name]))
        elif f.name in payload:
            kwargs[f.name] = payload[f.name]
    if "trajectories" in kwargs:
        kwargs["trajectories"] = _trajectories(type_tag, kwargs["trajectories"])
    try:
        message: Message = cls(**kwargs)
    except TypeError as exc:
        raise MalformedMessage(f"{type_tag}: {exc}") from exc
    return message


def _trajectories(type_tag: str, items: Any) -> list[Trajectory]:
    if not isinstance(items, list):
        raise MalformedMessage(f"{type_tag}: trajectories must be a list")
    try:
        return [Trajectory(**item) for item in items]
    except TypeError as exc:
        raise MalformedMessage(f"{type_tag}: bad trajectory ({exc})") from exc


def _parse_scalar(type_tag: str, f: dataclasses.Field[Any], text: str) -> Any:
    try:
        if f.type == "int":
            return int(text)
        if f.type == "float":
            return float(text)
        if f.type == "bool":
            return text in ("1", "True", "true")
        if f.type in _ENUMS:
            return _ENUMS[str(f.type)](text)
        return text
    except ValueError as exc:
        raise MalformedMessage(f"{type_tag}: field {f.name}={text!r} is not a {f.type}") from exc


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        if not value or isinstance(value[0], _SCALARS):
            return value  # token ids, logprobs: msgpack packs them as they are (no per-item walk)
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
