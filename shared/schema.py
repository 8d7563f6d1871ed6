"""Every message that crosses a Redis stream, and the one encode/decode pair.

Where it sits: services build these dataclasses and call `encode` before XADD,
`decode` after XREAD. Nothing else touches stream field encoding
(STYLE.md rule 1): `shared/codec.py` says how a message maps onto stream
fields (scalar fields as readable strings, everything bulky in one msgpack
`payload`, a `type` tag); the closed vocabularies the fields are typed with
live in `shared/vocab.py` and are re-exported here. A malformed entry raises
`MalformedMessage` (a ValueError) naming the problem; the reading service
dead-letters it, it never crashes the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.codec import PAYLOAD_FIELD as PAYLOAD_FIELD
from shared.codec import TYPE_FIELD as TYPE_FIELD
from shared.codec import Codec
from shared.codec import MalformedMessage as MalformedMessage
from shared.vocab import FINISHED as FINISHED
from shared.vocab import PUSH_ACTIONS as PUSH_ACTIONS
from shared.vocab import WEIGHT_ACTIONS as WEIGHT_ACTIONS
from shared.vocab import AuditKind as AuditKind
from shared.vocab import AuditPhase as AuditPhase
from shared.vocab import CommandAction as CommandAction
from shared.vocab import FinishReason as FinishReason
from shared.vocab import PushStep as PushStep
from shared.vocab import ReplicaState as ReplicaState
from shared.vocab import TrainerAction as TrainerAction
from shared.vocab import TrainerPhase as TrainerPhase

# ---- messages ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Trajectory:
    """One response to a prompt: one LLM request, maybe resumed across aborts."""

    request_id: str
    """Stable id `{sample_id}/{index}`; the same across retries (sticky routing)."""
    response_token_ids: list[int]
    response_logprobs: list[float]
    """Log-probability of each sampled token under the weights that generated it."""
    finish_reason: FinishReason
    """STOP or LENGTH once finished."""
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
    finish_reason: FinishReason
    """ABORT (partial), REJECTED (the replica was not serving) and ERROR (the engine raised) are retried."""
    weight_version: int
    attempt: int = 0
    """Echo of the request's attempt, so a late duplicate of an old attempt is ignored."""
    generation_time_s: float = 0.0
    decode_time_s: float = 0.0
    """Seconds from the attempt's first decoded token to its last (its prefill left out; 0 = unknown)."""
    decode_tokens: int = 0
    """The tokens decoded in decode_time_s."""
    mean_inflight_requests: float = 0.0
    """Requests the engine held on average over decode_time_s, this one included (0 = unknown)."""
    mean_context_tokens: float = 0.0
    """Context tokens (prompts and tokens so far) those requests held on average meanwhile: with the three
    above, what the controller fits an engine's step against its load from (core/measure.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """Controller (or the trainer, for a push) -> worker / load balancer / rollouter: one idempotent
    action."""

    type: ClassVar[str] = "command"
    command_id: str
    action: CommandAction
    replica_ids: list[str] = field(default_factory=list)
    """LB ADD / REMOVE: the replicas."""
    version: int = -1
    """Worker weight actions: the version to load; rollouter RESET_STALENESS: the new version."""
    weights_path: str = ""
    """UPDATE_WEIGHTS: the version's directory."""
    value: int = 0
    """SET_ACTIVE_REPLICAS: the number of serving replicas."""
    data: dict[str, Any] = field(default_factory=dict)
    """WEIGHTS_INIT / WEIGHTS_UPDATE: vLLM's init / update info for this replica (vLLM defines its shape)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaReport:
    """A worker's answer to any command: where the replica is now."""

    state: ReplicaState
    version: int
    """The weight version it serves."""
    duration_s: float
    """Time the command took."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingReport:
    """The load balancer's answer to any command: its routing table now."""

    members: list[str]
    """Replica ids it routes to, in insertion order."""
    loads: dict[str, int]
    """In-flight requests per member."""
    total_inflight: int
    waiting: int
    """Requests waiting for a replica (none is routable)."""
    changed: list[str] = field(default_factory=list)
    """ADD / REMOVE: the replicas that really joined or left."""
    cleared: int = 0
    """CLEAR_STICKY: the sticky sessions dropped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutReport:
    """The rollouter's answer to SET_ACTIVE_REPLICAS and RESET_STALENESS."""

    max_concurrent_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    """RESET_STALENESS: the closed version's rollouter metrics (names in core/metrics.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PushGroupReport:
    """One push of a weight sync: a sync pushes to its replicas in groups (shared/weight_transfer.py
    `push_plan`: standalones and hybrids apart, one broadcast group per role, or one ipc push per replica)."""

    replica_ids: list[str]
    ok: bool = True
    """False: the push failed with `error`, and these replicas reloaded from the filesystem."""
    error: str = ""
    push_s: float = 0.0
    transport: str = ""
    """The push transport of this group ('': the sync's `transport`, from a trainer before groups had one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightSyncReport:
    """The trainer's answer to SYNC_WEIGHTS: how the replicas got the version.
    `pushed`: a push was tried (`transport`: the transports tried, '+'-joined), one per group in
    `pushes`; `ok` False: a group's push failed (`error`: the failed groups' errors), and
    that group's replicas (every replica, without a push) reloaded the version from the filesystem.
    `push_s`: the pushes' time together."""

    replica_ids: list[str]
    version: int
    transport: str = ""
    pushed: bool = False
    ok: bool = True
    error: str = ""
    push_s: float = 0.0
    pushes: list[PushGroupReport] = field(default_factory=list)
    """Each push's outcome, in order (empty without a push)."""


Report = ReplicaReport | RoutingReport | RolloutReport | WeightSyncReport
"""What a command handler returns: the sender's typed answer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAck:
    """Reply to a Command, matched by command_id; an ok ack carries the sender's typed report."""

    type: ClassVar[str] = "ack"
    command_id: str
    sender: str
    ok: bool
    error: str = ""
    replica: ReplicaReport | None = None
    """From a rollout worker."""
    routing: RoutingReport | None = None
    """From the load balancer."""
    rollout: RolloutReport | None = None
    """From the rollouter."""
    weights: WeightSyncReport | None = None
    """From the trainer, for SYNC_WEIGHTS (RELEASE_GPUS is acked with no report)."""

    @classmethod
    def answer(cls, command: Command, *, sender: str, report: Report | None) -> CommandAck:
        """The ok ack of `command` carrying `report` (if any) in its typed field."""
        return cls(command_id=command.command_id, sender=sender, ok=True,
                   replica=report if isinstance(report, ReplicaReport) else None,
                   routing=report if isinstance(report, RoutingReport) else None,
                   rollout=report if isinstance(report, RolloutReport) else None,
                   weights=report if isinstance(report, WeightSyncReport) else None)


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
    event_id: str = ""
    """Unique per emission (the trainer service stamps it as it publishes): a copy of the entry
    carries the same id, a restarted trainer's repeat of the same phase a new one."""


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
class AuditEvent:
    """Lifecycle record for tests, charts and humans (the resource-time chart is drawn from these).

    Readers use the typed fields; `detail` is free text for humans, never parsed. A field that does
    not apply to the kind is None (or empty) and left off the wire.
    """

    type: ClassVar[str] = "audit"
    kind: AuditKind
    subject: str
    """Replica id, 'trainer', 'controller', 'loadbalancer'."""
    t: float
    """Unix time."""
    detail: str = ""
    version: int = -1
    phase: AuditPhase | None = None
    """PHASE."""
    global_steps: int | None = None
    """PHASE (TRAIN_START / TRAIN_END): the trainer's step."""
    state: ReplicaState | None = None
    """REPLICA_STATE: the replica's new state."""
    action: CommandAction | None = None
    """REPLICA_STATE: the command that moved it (None when the worker started); LB: ADD / REMOVE."""
    activated: bool | None = None
    """SWITCH: True when hybrids were activated, False when deactivated."""
    alive: bool | None = None
    """LB: a member's heartbeat expired (False) or came back (True)."""
    command: str = ""
    """COMMAND: the controller core command's kind (e.g. sync_weights)."""
    transport: str = ""
    """PUSH: the push transport."""
    ok: bool | None = None
    """PUSH: whether it succeeded."""
    error: str = ""
    duration_s: float | None = None
    """COMMAND, PUSH, SWITCH: how long it took."""
    replica_ids: list[str] = field(default_factory=list)
    """COMMAND, PUSH, LB: the replicas concerned."""
    decision: dict[str, Any] | None = None
    """DECISION: what the policy decided and the numbers it compared (its `explain_last_decision`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleMetrics:
    """Controller -> `metrics` stream: one sync cycle's metrics under the seed's names."""

    type: ClassVar[str] = "cycle_metrics"
    version: int
    global_steps: int
    t: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Regenerate:
    """Trainer -> rollouter: generate this sample again. It was queued, but its MessageQueue entry
    vanished; the trainer's script (services/trainer/vanished.py) moved it back to generating and writes
    this entry itself, with these field names."""

    type: ClassVar[str] = "regenerate"
    sample_id: str


Message = (CycleMetrics | Sample | GenerateRequest | GenerateResult | Command | CommandAck | TrainerEvent
           | TrainerReply | AuditEvent | Regenerate)
_CODEC = Codec(CycleMetrics, Sample, GenerateRequest, GenerateResult, Command, CommandAck, TrainerEvent,
               TrainerReply, AuditEvent, Regenerate)


def encode(message: Message) -> dict[Any, Any]:
    """Message -> stream fields: scalars as strings, the rest in one msgpack payload."""
    fields: dict[Any, Any] = _CODEC.encode(message)  # Any keys: redis-py's xadd takes a dict of a wide union
    return fields


def decode(raw: Mapping[Any, Any]) -> Message:
    """Stream fields -> message. Raises MalformedMessage, and nothing else, on any bad entry."""
    message: Message = _CODEC.decode(raw)
    return message
