"""Every Redis stream, consumer group and key name, in one place (STYLE.md rule 2).

Where it sits: every service and test builds its names from one `Names` object,
so that `redis-cli KEYS 'dynsched:*'` shows the whole system and a second run
on the same Redis can live under another namespace. No other module writes a
Redis key literal.

Data flow over the streams:

    rollouter --lb_requests--> loadbalancer --worker_requests(id)--> rollout-worker
    rollout-worker --lb_results--> loadbalancer --rollouter_results--> rollouter
    rollouter --mq--> trainer (consumer group TRAINER_GROUP; mq_size = its lag:
    samples not yet taken by the trainer)
    trainer --rollouter_regenerate--> rollouter (a queued sample whose mq entry vanished)
    trainer --trainer_events--> controller --trainer_replies / trainer_commands--> trainer
    controller --worker_commands(id) / lb_commands / rollouter_commands--> peers
    trainer --worker_commands(id)--> rollout-worker (a weight sync: reload or push steps)
    peers --controller_acks--> the command's sender (controller, or trainer)
    everyone --audit--> (tests, charts, redis-cli)

(docs/contracts.md draws it, with what each stream carries.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DEFAULT_NAMESPACE = "dynsched"

# Consumer groups (one per reading service).
TRAINER_GROUP = "trainer"
CONTROLLER_GROUP = "controller"
LOADBALANCER_GROUP = "loadbalancer"
ROLLOUTER_GROUP = "rollouter"
WORKER_GROUP = "worker"

# Leases and timeouts.
HEARTBEAT_TTL_S = 10
"""A service whose heartbeat key is older than this is considered dead."""
HEALTH_INTERVAL_S = 2.0
"""How often a service process publishes its loops' ages (`Names.health`)."""
HEALTH_TTL_S = 10
"""A process whose health key is older than this is down, hung, or cut off from Redis."""


def worker_process_name(replica_ids: list[str] | tuple[str, ...]) -> str:
    """A rollout worker process's service name for its health key (`Names.health`):
    `rollout_worker.ID`, IDs joined by ',' when one process runs several replicas."""
    return "rollout_worker." + ",".join(replica_ids)


MAX_DELIVERIES = 5
"""An entry delivered this many times without an ack goes to the dead-letter stream."""
REDIS_RETRY_WINDOW_S = 30.0
"""Default of run.redis_retry_window_s: how long every Redis call retries an unreachable Redis."""

# Bounded memory.
STREAM_RETENTION_S = 3600.0
"""Default of run.stream_retention_s: acked entries older than this are trimmed from grouped streams."""
DEAD_LETTER_MAXLEN = 10_000
"""Default of run.dead_letter_maxlen: the dead-letter stream keeps about this many newest entries."""
EVENT_STREAM_MAXLEN = 20_000
"""Default of run.event_stream_maxlen: the streams no consumer group reads (audit, metrics,
controller:acks) keep about this many newest entries."""
EVENT_STREAM_MIN_MAXLEN = 1_000
"""The least run.event_stream_maxlen: the newest cycles the dashboard draws (500) and the acks in
flight stay in their streams."""
DEAD_LETTER_FIELD_MAX_BYTES = 16_384
"""A dead letter keeps at most this many bytes of each field of the entry it copies."""


class SampleState(StrEnum):
    """A sample's lifecycle state, the values of the `sample_states` hash
    (fed -> generating -> queued -> trained, or dropped with a reason)."""

    GENERATING = "generating"
    QUEUED = "queued"
    TRAINED = "trained"
    DROPPED = "dropped"


class AccountingField(StrEnum):
    """Fields of the `accounting` hash: fed = generating + queued + trained + dropped."""

    FED = "fed"
    GENERATING = "generating"
    QUEUED = "queued"
    TRAINED = "trained"
    DROPPED = "dropped"
    VANISHED = "vanished"
    """Not a state: the times a queued sample went back to generating because its MessageQueue entry
    vanished (deleted or trimmed outside the run, or dead-lettered after too many deliveries)."""


class RolloutStateField(StrEnum):
    """Fields of the `rollouter_state` hash: the rollouter's counters and status snapshot."""

    EPOCH = "epoch"
    """Incremented at every rollouter start: the attempt numbers' epoch."""
    FED = "fed"
    TOTAL_GENERATED = "total_generated"
    CUT_SAMPLES = "cut_samples"
    """Of those, samples queued because an abort ended their last response (partial rollout off)."""
    COMPLETED_STEPS = "completed_steps"
    VERSION = "version"
    NUM_REPLICAS = "num_replicas"
    PAUSED = "paused"
    """'1' while paused by staleness or a full queue."""
    ACTIVE_TASKS = "active_tasks"
    FEED_DONE = "feed_done"
    """'1' once every prompt was fed."""
    MAX_CONCURRENT_SAMPLES = "max_concurrent_samples"
    STALENESS_SAMPLES = "staleness_samples"
    MQ_SIZE = "mq_size"
    IDLE_CLOSED_S = "idle_closed_s"
    """Seconds of the rollouter's closed idle windows (paused, nothing generating) since it started."""
    IDLE_SINCE_S = "idle_since_s"
    """Epoch seconds its open idle window began ('' while not idle)."""
    HANDED_OVER = "handed_over"
    """Samples a hybrid's abort handed to the standalones since the last staleness reset (this version)."""
    HANDED_OVER_ON_TIME = "handed_over_on_time"
    """Of those, the samples queued since (before the next sync, they arrived in their window's cycle)."""


class TrainerStateField(StrEnum):
    """Fields of the `trainer_state` hash."""

    RUN_ID = "run_id"
    GLOBAL_STEPS = "global_steps"
    """The next micro-step to train (1 before any)."""
    VERSION = "version"
    """The parameter version trained so far."""
    STALE_TRAJECTORIES = "stale_trajectories"
    WEIGHTS_VERSION = "weights_version"
    """The version of the last sync: what a (re)starting rollout worker loads."""
    WEIGHTS_PATH = "weights_path"
    INITIAL_SYNC_DONE = "initial_sync_done"
    SYNC_PENDING = "sync_pending"
    """'1' between a micro-step's commit and the end of its weight sync (a restart finishes it)."""
    CHECKPOINT = "checkpoint"
    """The checkpoint of the committed progress (the backend's pointer), written in the same commit."""


class RunStateField(StrEnum):
    """Fields of the `run_state` hash."""

    STATUS = "status"
    """A RunStatus."""
    STARTED_AT = "started_at"
    REASON = "reason"
    """Why the run failed."""


class RunStatus(StrEnum):
    """`status` field of the `run_state` hash."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Names:
    """All names for one run, under one namespace prefix."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def pattern(self) -> str:
        """Glob matching every key of this namespace (for SCAN)."""
        return self._key("*")

    def _key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    # --- streams -------------------------------------------------------------
    @property
    def mq(self) -> str:
        """The MessageQueue: finished samples, read by the trainer's consumer group."""
        return self._key("mq")

    @property
    def lb_requests(self) -> str:
        """Generation requests from the rollouter to the load balancer."""
        return self._key("lb", "requests")

    @property
    def lb_results(self) -> str:
        """Finished or aborted generations from workers, back through the load balancer."""
        return self._key("lb", "results")

    @property
    def lb_commands(self) -> str:
        return self._key("lb", "commands")

    def worker_requests(self, replica_id: str) -> str:
        return self._key("worker", replica_id, "requests")

    def worker_commands(self, replica_id: str) -> str:
        return self._key("worker", replica_id, "commands")

    @property
    def rollouter_results(self) -> str:
        return self._key("rollouter", "results")

    @property
    def rollouter_commands(self) -> str:
        return self._key("rollouter", "commands")

    @property
    def rollouter_regenerate(self) -> str:
        """Trainer -> rollouter: queued samples whose MessageQueue entry vanished, to generate again."""
        return self._key("rollouter", "regenerate")

    @property
    def trainer_events(self) -> str:
        """Trainer -> controller step-phase events."""
        return self._key("trainer", "events")

    @property
    def trainer_replies(self) -> str:
        """Controller -> trainer replies (gpus released, release your GPU, sync done)."""
        return self._key("trainer", "replies")

    @property
    def trainer_commands(self) -> str:
        """Controller -> trainer commands during a sync (release GPUs, sync weights), acked like any."""
        return self._key("trainer", "commands")

    @property
    def controller_acks(self) -> str:
        """Acknowledgements of controller commands from workers, LB and rollouter."""
        return self._key("controller", "acks")

    @property
    def audit(self) -> str:
        """Append-only log of lifecycle events (replica states, switches, phases)."""
        return self._key("audit")

    @property
    def metrics(self) -> str:
        """One entry per sync cycle with the seed's metrics."""
        return self._key("metrics")

    @property
    def dead_letters(self) -> str:
        return self._key("dead")

    # --- keys ------------------------------------------------------------------
    @property
    def controller_state(self) -> str:
        """Controller core snapshot (msgpack), so a restarted controller resumes."""
        return self._key("controller", "state")

    @property
    def controller_admin(self) -> str:
        """Address of the controller's admin API (host:port), for the CLI."""
        return self._key("controller", "admin")

    @property
    def lb_members(self) -> str:
        """List of replica ids the load balancer routes to, in insertion order (survives an LB restart)."""
        return self._key("lb", "members")

    @property
    def rollouter_state(self) -> str:
        """Hash of the rollouter's counters and status (fields: RolloutStateField)."""
        return self._key("rollouter", "state")

    @property
    def sample_states(self) -> str:
        """Hash sample_id -> its SampleState."""
        return self._key("samples")

    @property
    def accounting(self) -> str:
        """Hash of counters (fields: AccountingField): fed = generating + queued + trained + dropped."""
        return self._key("accounting")

    @property
    def trainer_state(self) -> str:
        """Hash of the trainer's progress (fields: TrainerStateField)."""
        return self._key("trainer", "state")

    @property
    def replica_states(self) -> str:
        """Hash replica_id -> "{ReplicaState}:{version}" (e.g. "serving:3")."""
        return self._key("replicas")

    def worker_heartbeat(self, replica_id: str) -> str:
        """String key with a TTL: the worker process's incarnation id while it is alive."""
        return self._key("heartbeat", f"worker:{replica_id}")

    def worker_serving(self, replica_id: str) -> str:
        """String key: the incarnation id of the worker process that finished starting (engine up,
        newest weights loaded, commands read); a starting or restarted process has not written it yet."""
        return self._key("serving", f"worker:{replica_id}")

    def health(self, service: str) -> str:
        """String key with a TTL: JSON {loop: seconds since its last beat} of one service process
        (shared.health publishes it, `python -m shared.health` checks it)."""
        return self._key("health", service)

    @property
    def controller_policy(self) -> str:
        """The policy name chosen through the admin API (PUT /policy): a restarted controller uses
        it instead of the config's."""
        return self._key("controller", "policy")

    @property
    def unresponsive(self) -> str:
        """Hash heartbeat key -> the incarnation that let a command pass its deadline unacked (a hung
        engine): that process counts as gone (shared.peer_liveness) until a new incarnation beats."""
        return self._key("unresponsive")

    def lease(self, consumer: str) -> str:
        return self._key("lease", consumer)

    def handled(self, consumer: str, message_id: str) -> str:
        """A key with a TTL saying that `consumer` handled the message `message_id`: for a Command, a
        hash of the ack it gave (its stream fields); for a TrainerEvent, a flag. A copy of the
        message (redelivered, re-sent after a lost ack, replayed late) is answered from here, never
        applied twice: a stale SLEEP replayed after a WAKE must not put the replica back to sleep."""
        return self._key("handled", consumer, message_id)

    @property
    def run_state(self) -> str:
        """Hash of the run's status (fields: RunStateField; status: a RunStatus)."""
        return self._key("run")
