"""One rollout replica as a service: generation requests and controller commands in, results out.

Where it sits: the load balancer routes GenerateRequests to this replica's
request stream; results go back on the load balancer's result stream. The
controller drives the replica's lifecycle (core.replica) over its command
stream and gets a CommandAck for each command.

A request that reaches a replica that is not SERVING (removed, aborted,
asleep) is answered at once with finish_reason 'rejected' and zero tokens, so
the rollouter retries it elsewhere: requests are never parked here.

A result and the XACK of its request go in one MULTI (with every other result
queued meanwhile), so a crash never leaves a sent result with its request still
pending. Clean stop: in-flight generations are aborted and their partial tokens sent
back (the rollouter resumes them elsewhere), then the loops end. Crash:
unacked requests and commands stay pending in this replica's consumer groups
and are replayed when a worker with the same replica id starts again;
duplicates are harmless (results carry the request's attempt, a command is
applied once per command_id (`Bus.serve_commands`: a copy gets the first ack
again), and a weight-push step names the worker process it is for, so a
restarted worker refuses the steps of a group it never joined).

A push step that does not end within `push_timeout_s` (the trainer died or hung
mid-broadcast: vLLM's NCCL receive has no limit, and the engine's busy loop is
stuck in it) raises EngineWedged: the worker stops without touching the engine
and the process exits, so its restart policy starts a clean one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from core.replica import ReplicaState, transition
from services.rollout_worker.engine import Engine, EngineOutput
from shared.bus import Bus, Subscription, text
from shared.names import HEARTBEAT_TTL_S, WORKER_GROUP, TrainerStateField
from shared.peer_liveness import clear_unresponsive
from shared.runtime import sleep_unless, supervise
from shared.schema import (
    PUSH_ACTIONS,
    AuditEvent,
    AuditKind,
    Command,
    CommandAction,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PushStep,
    ReplicaReport,
)
from shared.weight_transfer import TARGET_KEY, TIMEOUT_S

log = logging.getLogger(__name__)
_PUSH_STEPS = {action: step for step, action in PUSH_ACTIONS.items()}
"""The trainer-driven push's actions, as the engine's `transfer` names its steps."""


class EngineWedged(RuntimeError):
    """The engine is stuck in a weight push (a peer died mid-broadcast): the process must exit
    and be restarted with a fresh engine. Not a ValueError, so it is never acked as a rejection."""


class RolloutWorker:
    def __init__(self, *, bus: Bus, replica_id: str, engine: Engine, initial_state: ReplicaState,
                 incarnation: str = "", push_timeout_s: float = TIMEOUT_S) -> None:
        self.bus = bus
        self.replica_id = replica_id
        self.incarnation = incarnation or uuid.uuid4().hex[:12]
        """This process's identity, the heartbeat's value: a new one tells the trainer that a
        replica restarted and lost its end of a weight-push group."""
        self.engine = engine
        self.state = initial_state
        self.version = 0
        self.push_timeout_s = push_timeout_s
        """Limit of one weight-push step on this replica (the rendezvous, a whole broadcast)."""
        self.wedged = False
        self._resume_after_push = False
        self._inflight: set[asyncio.Task[None]] = set()
        self._outbox: list[tuple[str, GenerateResult]] = []
        """Results not yet sent, each with the request entry it answers (see `_answer`)."""
        self._sending = False

    async def run(self, stop: asyncio.Event) -> None:
        """1. take up the state a previous incarnation published, if any, and load the newest
        published weights; 2. a replica that starts SLEEPING (a hybrid) puts its engine to sleep,
        so the trainer's GPU memory is free before any activation; 3. publish the initial state;
        4. serve commands, requests and heartbeats until `stop`; 5. abort in-flight generations
        so their partial tokens go back to the rollouter. The heartbeat beats from the start, so
        peers see a worker that dies in steps 1-2 gone within its TTL; one failing loop cancels
        the others and fails the process (shared.runtime.supervise)."""
        prefix = f"rollout_worker.{self.replica_id}"

        async def serve() -> None:
            self.state = await self._restored_state()
            await self._catch_up()
            if self.state is ReplicaState.SLEEPING:
                await self.engine.sleep()
            await self._publish_state(None)
            await self.bus.redis.set(self.bus.names.worker_serving(self.replica_id), self.incarnation)
            await supervise({f"{prefix}.commands": self._serve_commands(stop),
                             f"{prefix}.requests": self._serve_requests(stop)})

        try:
            await supervise({f"{prefix}.heartbeat": self._heartbeat(stop), f"{prefix}.serve": serve()})
        finally:
            if self.wedged:  # the engine would not answer: leave it to the process's exit, and
                # let the trainer's watch see this worker gone now rather than at the heartbeat's TTL
                await self.bus.redis.delete(self.bus.names.worker_heartbeat(self.replica_id))
            else:
                await self.engine.abort_all()
                if self._inflight:
                    await asyncio.wait(self._inflight, timeout=5.0)

    async def _restored_state(self) -> ReplicaState:
        """A worker restarted mid-run takes up the state its last incarnation published (the namespace
        is fresh at each run's start, so a published state is this run's): the commands the controller
        sent since are replayed from this replica's stream, and each is legal from there. Started in
        `initial_state` instead, a hybrid killed after its wake was acked came back asleep, refused the
        activation's weight sync and resume, and the refusal stopped the controller. A fresh start has
        nothing published and keeps `initial_state`."""
        raw = await self.bus.redis.hget(self.bus.names.replica_states, self.replica_id)
        if raw is None:
            return self.state
        try:
            state = ReplicaState(text(raw).partition(":")[0])
        except ValueError:
            log.error("%s: unreadable published state %r; starts %s", self.replica_id, raw, self.state.value)
            return self.state
        log.info("%s: restarted mid-run, takes up its published state %s", self.replica_id, state.value)
        return state

    async def _catch_up(self) -> None:
        """A replica (re)started mid-run loads the weights of the trainer's last sync, instead of
        generating with the base model until the next one; if that fails it says so and goes on."""
        raw_version, raw_path = await self.bus.redis.hmget(
            self.bus.names.trainer_state, [TrainerStateField.WEIGHTS_VERSION, TrainerStateField.WEIGHTS_PATH])
        version = int(raw_version or 0)
        if version <= self.version:
            return
        await self.engine.abort_all()
        try:
            await self.engine.load_weights(version=version, path=text(raw_path or b"") or None)
        except Exception as exc:
            log.error("%s: could not load weights v%d at start (serving v%d until the next sync): %s",
                      self.replica_id, version, self.version, exc)
        else:
            self.version = version
        finally:
            await self.engine.resume()
        log.info("%s: starts at weights v%d", self.replica_id, self.version)

    async def _serve_requests(self, stop: asyncio.Event) -> None:
        names = self.bus.names
        sub = await self.bus.subscribe(names.worker_requests(self.replica_id), WORKER_GROUP, self.replica_id)
        try:
            while not stop.is_set():
                for entry_id, message in await sub.read(count=256, block_ms=200):
                    await self._take(entry_id, message, sub)
        finally:
            await sub.close()

    async def _take(self, entry_id: str, message: object, sub: Subscription) -> None:
        if not isinstance(message, GenerateRequest):
            log.error("%s: ignoring %s on request stream", self.replica_id, type(message).__name__)
            await sub.ack(entry_id)
        elif self.state is not ReplicaState.SERVING:
            await self._answer(sub, entry_id, self._result(message, token_ids=[], logprobs=[],
                                                           finish_reason=FinishReason.REJECTED))
        else:
            task = asyncio.create_task(self._generate(message, entry_id, sub))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _generate(self, request: GenerateRequest, entry_id: str, sub: Subscription) -> None:
        """Generate and answer. An engine that raises on this request (out of memory, a prompt it
        refuses) is answered `error` with no tokens, so the rollouter retries it (a bounded number of
        times) instead of the request waiting, unanswered, for a restart that never comes."""
        version = self.version
        started = time.monotonic()
        try:
            output = await self.engine.generate(
                request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                max_tokens=request.max_tokens
            )
        except Exception as exc:
            log.error("%s: the engine failed %s (attempt %d): %s: %s", self.replica_id, request.request_id,
                      request.attempt, type(exc).__name__, exc)
            output = EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ERROR)
        await self._answer(sub, entry_id, self._result(
            request, token_ids=output.token_ids, logprobs=output.logprobs, finish_reason=output.finish_reason,
            version=version, generation_time_s=time.monotonic() - started, timings=output.timings))

    def _result(self, request: GenerateRequest, *, token_ids: list[int], logprobs: list[float],
                finish_reason: FinishReason, version: int | None = None,
                generation_time_s: float = 0.0, timings: dict[str, float] | None = None) -> GenerateResult:
        timings = timings or {}
        return GenerateResult(
            request_id=request.request_id, sample_id=request.sample_id, replica_id=self.replica_id,
            token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
            weight_version=self.version if version is None else version, attempt=request.attempt,
            generation_time_s=generation_time_s, decode_time_s=timings.get("decode_s", 0.0),
            decode_tokens=int(timings.get("decode_tokens", 0)),
            mean_inflight_requests=timings.get("mean_inflight", 0.0),
            mean_context_tokens=timings.get("mean_context", 0.0),
        )

    async def _answer(self, sub: Subscription, entry_id: str, result: GenerateResult) -> None:
        """Send `result` and ack the request entry it answers, in one MULTI with every result queued
        meanwhile. An abort resolves its 128-256 generations at once: one round trip for all of them,
        not two each, keeps the abort's own ack from queueing behind them. The first caller sends
        until the outbox is empty; the others return at once (their result is in its next batch).
        A crash before a batch's MULTI leaves its requests pending (replayed to the restarted worker,
        as before); after it, each result is sent and its request acked, never one without the other."""
        self._outbox.append((entry_id, result))
        if self._sending:
            return
        self._sending = True
        try:
            while self._outbox:
                batch, self._outbox = self._outbox, []
                await sub.answer(self.bus.names.lb_results, batch)
        finally:
            self._sending = False

    async def _serve_commands(self, stop: asyncio.Event) -> None:
        names = self.bus.names
        sub = await self.bus.subscribe(names.worker_commands(self.replica_id), WORKER_GROUP, self.replica_id)
        try:
            await self.bus.serve_commands(sub, stop, sender=self.replica_id, apply=self._apply)
        finally:
            await sub.close()

    async def _apply(self, command: Command) -> ReplicaReport:
        """Illegal in this state (IllegalReplicaTransition) or unknown: a ValueError, acked as not ok."""
        started = time.monotonic()
        next_state = transition(self.state, command.action)
        await self._run_engine(command)
        self.state = next_state
        names = self.bus.names  # applied: a worker marked unresponsive (a hung engine) answers again
        await clear_unresponsive(self.bus.redis, names, names.worker_heartbeat(self.replica_id))
        await self._publish_state(command.action)
        return ReplicaReport(state=self.state, version=self.version, duration_s=time.monotonic() - started)

    async def _run_engine(self, command: Command) -> None:
        action = command.action
        if action is CommandAction.ABORT:
            await self.engine.abort_all()
        elif action is CommandAction.RESUME:
            await self.engine.resume()
        elif action is CommandAction.SLEEP:
            await self.engine.sleep()
        elif action is CommandAction.WAKE:
            if self.state is ReplicaState.SLEEPING:
                await self.engine.wake()
        elif action is CommandAction.UPDATE_WEIGHTS:
            self._resume_after_push = False  # the fallback after a failed push resumes below
            if command.version < self.version:  # a reload sent while this worker started, replayed
                log.info("%s: skips update_weights v%d (holds v%d)", self.replica_id, command.version,
                         self.version)
                return
            serving = self.state is ReplicaState.SERVING
            if serving:
                await self.engine.abort_all()
            await self.engine.load_weights(version=command.version, path=command.weights_path or None)
            self.version = command.version
            if serving:
                await self.engine.resume()
        elif action in _PUSH_STEPS:
            await self._push_step(command)
        else:
            raise ValueError(f"unknown worker action {action!r}")

    async def _push_step(self, command: Command) -> None:
        """A step of the trainer's weight push; a SERVING replica is paused from start to finish.
        A failure is acked as not ok (the trainer then falls back to the filesystem)."""
        step = _PUSH_STEPS[command.action]
        info = dict(command.data)
        target = info.pop(TARGET_KEY, "")
        if target and target != self.incarnation:
            raise ValueError(f"weight push {step} is for worker {target}, this is {self.incarnation}: "
                             "a step of a group this process never joined (replayed after a restart)")
        if step is PushStep.START and self.state is ReplicaState.SERVING:
            await self.engine.abort_all()
            self._resume_after_push = True
        # `init` waits for the whole group's rendezvous, which its store bounds by itself (TIMEOUT_S):
        # let that fail first (acked not ok) rather than exit for a slow peer's engine start.
        limit_s = self.push_timeout_s + (TIMEOUT_S if step is PushStep.INIT else 0.0)
        deadline = asyncio.timeout(limit_s)
        try:
            async with deadline:
                await self.engine.transfer(step, info, version=command.version)
        except TimeoutError as exc:
            if not deadline.expired():
                raise ValueError(f"weight push {step} failed: TimeoutError: {exc}") from exc
            self.wedged = True
            raise EngineWedged(f"{self.replica_id}: weight push {step} still running after "
                               f"{limit_s:.0f}s; exiting so a fresh engine replaces this one") from exc
        except Exception as exc:
            raise ValueError(f"weight push {step} failed: {type(exc).__name__}: {exc}") from exc
        if command.action is CommandAction.WEIGHTS_FINISH:
            self.version = command.version
            if self._resume_after_push:
                self._resume_after_push = False
                await self.engine.resume()

    async def _publish_state(self, action: CommandAction | None) -> None:
        """The state in `replica_states` and on the audit stream; `action` None: the worker started."""
        names = self.bus.names
        await self.bus.redis.hset(names.replica_states, self.replica_id, f"{self.state.value}:{self.version}")
        reason = action.value if action else "started"
        await self.bus.record(AuditEvent(kind=AuditKind.REPLICA_STATE, subject=self.replica_id, t=time.time(),
                                         state=self.state, action=action, version=self.version,
                                         detail=f"{self.state.value} ({reason})"))

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        key = self.bus.names.worker_heartbeat(self.replica_id)
        while not stop.is_set():
            await self.bus.redis.set(key, self.incarnation, ex=HEARTBEAT_TTL_S)
            await sleep_unless(stop, HEARTBEAT_TTL_S / 3)
