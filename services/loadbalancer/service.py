"""The load balancer service: routes every generation attempt to one serving replica.

Where it sits: between the rollouter and the rollout-workers. It reads
GenerateRequests from `lb_requests`, picks a replica with the pure
`core.routing.LoadBalancerState` (least in-flight, sticky LRU), forwards the
request to that replica's stream; it reads GenerateResults from `lb_results`,
releases the replica's slot and forwards the result to the rollouter. The
controller adds/removes replicas and clears the sticky cache over
`lb_commands`.

Because results pass through here, in-flight counts are exact, not
fire-and-forget. A request that arrives while the pool is empty (colocated
mode between a deactivation and the next activation) waits here, unacked,
and is routed as soon as a replica is added; no replica ever parks one.

Clean stop: loops end; waiting requests stay unacked in the consumer group.
Crash: everything unacked is replayed on restart; membership is reloaded
from Redis (`lb_members`); each member's in-flight count is restored to the
requests its worker has not acked yet (its request stream's lag + pending).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque

from redis.exceptions import ResponseError

from core.routing import LoadBalancerState, NoReplicaAvailable
from shared.bus import Bus, Subscription, text
from shared.names import HEARTBEAT_TTL_S, LOADBALANCER_GROUP, WORKER_GROUP
from shared.peer_liveness import alive
from shared.runtime import sleep_unless, supervise
from shared.schema import (
    FINISHED,
    AuditEvent,
    AuditKind,
    Command,
    CommandAction,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    MalformedMessage,
    RoutingReport,
    decode,
)
from shared.streams import StreamConsumer, group_lag, group_pending

log = logging.getLogger(__name__)
CONSUMER = "loadbalancer"
WATCH_INTERVAL_S = 1.0
STARTUP_GRACE_S = 2.0 * HEARTBEAT_TTL_S
"""A member never seen alive (its process not started yet) is judged gone only after this long:
one killed during its start-up, before this load balancer saw it, must not strand requests."""


class LoadBalancer:
    def __init__(self, *, bus: Bus, initial_replica_ids: tuple[str, ...]) -> None:
        self.bus = bus
        self.initial_replica_ids = initial_replica_ids
        self.state = LoadBalancerState()
        self._waiting: deque[tuple[str, GenerateRequest]] = deque()
        self._dead: set[str] = set()
        """Members whose heartbeat expired: out of routing until it returns."""
        self._known: set[str] = set()
        """Every replica ever a member or asked to join, however briefly: the watch checks them all for
        stranded requests (a hybrid may be added, routed to and removed between two of its polls)."""
        self._seen_alive: set[str] = set()
        """Replicas seen beating (by the watch, or when added): gone as soon as their beat stops."""
        self.routing_latencies_s: deque[float] = deque(maxlen=10_000)

    async def run(self, stop: asyncio.Event) -> None:
        """1. load membership; 2. route requests, relay results and apply commands until `stop`."""
        await self._load_members()
        names = self.bus.names
        requests = await self.bus.subscribe(names.lb_requests, LOADBALANCER_GROUP, CONSUMER)
        results = await self.bus.subscribe(names.lb_results, LOADBALANCER_GROUP, CONSUMER)
        commands = await self.bus.subscribe(names.lb_commands, LOADBALANCER_GROUP, CONSUMER)
        loops = {"loadbalancer.route": self._route(requests, stop),
                 "loadbalancer.relay": self._relay(results, stop),
                 "loadbalancer.watch": self._watch_replicas(stop),
                 "loadbalancer.commands": self.bus.serve_commands(commands, stop, sender=CONSUMER,
                                                                  apply=self._apply)}
        try:
            await supervise(loops)
        finally:
            for sub in (requests, results, commands):
                await sub.close()

    async def _load_members(self) -> None:
        stored = [text(m) for m in await self.bus.redis.lrange(self.bus.names.lb_members, 0, -1)]
        self.state.add_replicas(stored if stored else self.initial_replica_ids)
        self._known.update(self.state.replica_ids)
        # after a restart: every worker that ever reported a state may hold requests routed before it
        self._known.update(text(r) for r in await self.bus.redis.hkeys(self.bus.names.replica_states))
        for replica_id in self.state.replica_ids:  # after a restart: what each replica still owes
            stream = self.bus.names.worker_requests(replica_id)
            self.state.set_inflight(replica_id, await _unacked(self.bus, stream))
        await self._save_members()
        log.info("routing to %s", list(self.state.replica_ids))

    async def _save_members(self) -> None:
        key = self.bus.names.lb_members
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            members = list(self.state.replica_ids) + sorted(self._dead)  # the controller's view
            if members:
                pipe.rpush(key, *members)
            await pipe.execute()

    async def _route(self, sub: Subscription, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for entry_id, message in await sub.read(count=256, block_ms=200):
                if isinstance(message, GenerateRequest):
                    self._waiting.append((entry_id, message))
                else:
                    await sub.ack(entry_id)
            await self._dispatch_waiting(sub)

    async def _dispatch_waiting(self, sub: Subscription) -> None:
        routed: list[tuple[str, GenerateRequest]] = []
        while self._waiting:
            entry_id, request = self._waiting[0]
            started = time.perf_counter()
            try:
                replica_id = self.state.acquire(request.request_id)
            except NoReplicaAvailable:
                break
            self._waiting.popleft()
            self.routing_latencies_s.append(time.perf_counter() - started)
            routed.append((entry_id, dataclasses.replace(request, replica_id=replica_id)))
        if routed:
            await self.bus.publish_many([(self.bus.names.worker_requests(r.replica_id), r)
                                         for _, r in routed])
            await sub.ack(*(entry_id for entry_id, _ in routed))

    async def _relay(self, sub: Subscription, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await sub.read(count=256, block_ms=200)
            forward = []
            for _, message in batch:
                if isinstance(message, GenerateResult):
                    self.state.release(message.replica_id)
                    if message.finish_reason in FINISHED or message.finish_reason is FinishReason.ERROR:
                        self.state.forget(message.request_id)  # done, or let its retry leave a failing engine
                    forward.append((self.bus.names.rollouter_results, message))
            await self.bus.publish_many(forward)
            await sub.ack(*(entry_id for entry_id, _ in batch))

    async def _watch_replicas(self, stop: asyncio.Event) -> None:
        """A member that is gone (heartbeat expired, or unresponsive: shared.peer_liveness) is taken out
        of routing until it is alive again (a restarted worker). The requests stranded in the
        stream of any replica ever routed to that is gone (queued, or taken and never answered)
        are answered 'rejected' so the rollouter retries them elsewhere: a member too, and a
        replica the controller removed before its death was seen (its abort never ran)."""
        grace_ends = time.monotonic() + STARTUP_GRACE_S
        while not stop.is_set():
            watched = sorted(self._known)
            beats = [self.bus.names.worker_heartbeat(r) for r in watched]
            ups = await alive(self.bus.redis, self.bus.names, beats)
            gone = []
            for replica_id, up in zip(watched, ups, strict=True):
                if up:
                    self._seen_alive.add(replica_id)
                    if replica_id in self._dead:
                        self._dead.discard(replica_id)
                        self.state.add_replicas([replica_id])
                        await self._audit(f"alive again {replica_id}", alive=True, replica_ids=[replica_id])
                elif replica_id in self._seen_alive or time.monotonic() > grace_ends:
                    gone.append(replica_id)
                    if replica_id in self.state.replica_ids:
                        self._dead.add(replica_id)
                        self.state.remove_replicas([replica_id])
                        await self._audit(f"dead {replica_id}", alive=False, replica_ids=[replica_id])
            for replica_id in gone:
                await self._reject_stranded(replica_id)
            await sleep_unless(stop, WATCH_INTERVAL_S)

    async def _reject_stranded(self, replica_id: str) -> None:
        names = self.bus.names
        rescuer = StreamConsumer(self.bus.redis, stream=names.worker_requests(replica_id), group=WORKER_GROUP,
                                 consumer=f"{CONSUMER}-rescue", dead_letter_stream=names.dead_letters,
                                 lease_key_prefix=names.lease(""))
        await rescuer.start()
        try:
            # the replica's own consumer too: a hung worker still renews its lease
            await rescuer.reclaim_dead(also=(replica_id,))
            answered = 0
            while entries := await rescuer.read(count=1024, block_ms=0):  # reclaimed: one per read
                answers = []
                for entry in entries:
                    try:
                        request = decode(entry.fields)
                    except MalformedMessage:
                        continue  # garbage: acked below, nothing to answer
                    if isinstance(request, GenerateRequest):
                        answers.append((names.rollouter_results, GenerateResult(
                            request_id=request.request_id, sample_id=request.sample_id, replica_id=replica_id,
                            token_ids=[], logprobs=[], finish_reason=FinishReason.REJECTED, weight_version=-1,
                            attempt=request.attempt)))
                await self.bus.publish_many(answers)
                await rescuer.ack([e.entry_id for e in entries])
                answered += len(answers)
            if answered:
                log.warning("answered %d requests stranded on dead replica %s", answered, replica_id)
        finally:
            await rescuer.aclose(release_lease=True)

    async def _apply(self, command: Command) -> RoutingReport:
        changed: list[str] = []
        cleared = 0
        if command.action is CommandAction.ADD:  # a gone member joins routing when it is alive again
            beats = [self.bus.names.worker_heartbeat(r) for r in command.replica_ids]
            ups = await alive(self.bus.redis, self.bus.names, beats)
            up = dict(zip(command.replica_ids, ups, strict=True))
            self._dead.update(r for r in command.replica_ids if not up[r] and r not in self.state.replica_ids)
            changed = self.state.add_replicas(r for r in command.replica_ids if r not in self._dead)
            self._known.update(command.replica_ids)
            self._seen_alive.update(r for r in command.replica_ids if up[r])
        elif command.action is CommandAction.REMOVE:
            changed = self.state.remove_replicas(command.replica_ids)
            self._dead.difference_update(command.replica_ids)
        elif command.action is CommandAction.CLEAR_STICKY:
            cleared = self.state.clear_sticky()
        elif command.action is not CommandAction.INFLIGHT:
            raise ValueError(f"unknown load-balancer action {str(command.action)!r}")
        if command.action in (CommandAction.ADD, CommandAction.REMOVE):
            await self._save_members()
            await self._audit(f"{command.action} {command.replica_ids}", action=command.action,
                              replica_ids=list(command.replica_ids))
        return RoutingReport(members=list(self.state.replica_ids), loads=self.state.loads(),
                             total_inflight=self.state.total_inflight(), waiting=len(self._waiting),
                             changed=changed, cleared=cleared)

    async def _audit(self, detail: str, *, alive: bool | None = None, action: CommandAction | None = None,
                     replica_ids: list[str]) -> None:
        await self.bus.record(AuditEvent(kind=AuditKind.LB, subject=CONSUMER, t=time.time(), detail=detail,
                                         alive=alive, action=action, replica_ids=replica_ids))


async def _unacked(bus: Bus, stream: str) -> int:
    """Requests in a worker's stream it has not acked, read or not (it still owes their results)."""
    try:
        queued = await group_lag(bus.redis, stream, WORKER_GROUP)
        return queued + await group_pending(bus.redis, stream, WORKER_GROUP)
    except ResponseError:  # no such stream or group yet: nothing was read
        return await group_lag(bus.redis, stream, WORKER_GROUP)
