"""The load balancer service against a real Redis (no other services running)."""

from __future__ import annotations

import asyncio

from services.loadbalancer import service as lb_service
from services.loadbalancer.service import WATCH_INTERVAL_S, LoadBalancer
from shared.bus import Bus
from shared.names import WORKER_GROUP, Names
from shared.schema import Command, CommandAction, FinishReason, GenerateRequest, GenerateResult, decode
from shared.stream_groups import ensure_group
from shared.streams import connect


async def test_a_restarted_load_balancer_counts_the_requests_each_worker_has_not_answered(redis_server):
    """standalone_0 holds 2 requests read but unacked and 1 unread; standalone_1 answered all."""
    bus = Bus(connect(redis_server.url), Names("test"))
    try:
        for replica_id, routed, answered in (("standalone_0", 3, 0), ("standalone_1", 2, 2)):
            stream = bus.names.worker_requests(replica_id)
            await bus.redis.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
            for i in range(routed):
                await bus.publish(stream, GenerateRequest(request_id=f"{replica_id}/{i}", sample_id="s",
                                                          prompt_token_ids=[1], max_tokens=4,
                                                          replica_id=replica_id))
            read = await bus.redis.xreadgroup(WORKER_GROUP, replica_id, {stream: ">"}, count=2)
            entry_ids = [entry_id for _, entries in read for entry_id, _ in entries]
            if answered:
                await bus.redis.xack(stream, WORKER_GROUP, *entry_ids[:answered])
        lb = LoadBalancer(bus=bus, initial_replica_ids=("standalone_0", "standalone_1"))
        await lb._load_members()
        assert lb.state.inflight == {"standalone_0": 3, "standalone_1": 0}
        assert lb.state.acquire("next") == "standalone_1"
    finally:
        await bus.redis.aclose()


async def test_a_hybrid_added_and_removed_between_two_watch_polls_then_dead_has_its_requests_rejected(
        redis_server):
    """The controller adds a hybrid, the balancer routes to it, the controller removes it, all within one
    watch interval; the hybrid's worker is dead: its request must come back 'rejected' (for a retry
    elsewhere), or its sample waits forever."""
    names = Names("test")
    bus = Bus(connect(redis_server.url), names)
    stop = asyncio.Event()
    lb = LoadBalancer(bus=bus, initial_replica_ids=("standalone_0",))
    results = names.rollouter_results
    await ensure_group(bus.redis, results, "check")
    running: asyncio.Task[None] | None = None
    try:
        await bus.redis.set(names.worker_heartbeat("standalone_0"), "inc-s", ex=60)
        await bus.redis.set(names.worker_heartbeat("hybrid_0"), "inc-h", ex=60)
        running = asyncio.create_task(lb.run(stop))
        await asyncio.sleep(0.2)  # the watch has polled once: only standalone_0 is a member
        await lb._apply(Command(command_id="add", action=CommandAction.ADD, replica_ids=["hybrid_0"]))
        await _route_one_request(bus, "hybrid_0")
        await lb._apply(Command(command_id="remove", action=CommandAction.REMOVE, replica_ids=["hybrid_0"]))
        await bus.redis.delete(names.worker_heartbeat("hybrid_0"))  # killed: its beat is gone
        async with asyncio.timeout(5 * WATCH_INTERVAL_S):
            answered = await _results(bus, results)
        assert [(r.request_id, r.finish_reason) for r in answered] == [("s/0", FinishReason.REJECTED)]
        assert not running.done()
    finally:
        stop.set()
        if running is not None:
            await asyncio.wait_for(running, timeout=10)
        await bus.redis.aclose()


async def test_a_restarted_load_balancer_rescues_requests_stranded_on_a_dead_hybrid_removed_before_it_started(
        redis_server, monkeypatch):
    monkeypatch.setattr(lb_service, "STARTUP_GRACE_S", 0.5)
    names = Names("test")
    bus = Bus(connect(redis_server.url), names)
    stop = asyncio.Event()
    results = names.rollouter_results
    await ensure_group(bus.redis, results, "check")
    running: asyncio.Task[None] | None = None
    try:
        await bus.redis.hset(names.replica_states, "hybrid_0", "serving:3")  # it ran, then died
        await _route_one_request(bus, "hybrid_0")
        await bus.redis.set(names.worker_heartbeat("standalone_0"), "inc-s", ex=60)
        lb = LoadBalancer(bus=bus, initial_replica_ids=("standalone_0",))
        running = asyncio.create_task(lb.run(stop))
        async with asyncio.timeout(5 * WATCH_INTERVAL_S):
            answered = await _results(bus, results)
        assert [(r.request_id, r.finish_reason) for r in answered] == [("s/0", FinishReason.REJECTED)]
    finally:
        stop.set()
        if running is not None:
            await asyncio.wait_for(running, timeout=10)
        await bus.redis.aclose()


async def _route_one_request(bus: Bus, replica_id: str) -> None:
    """Request 's/0' in `replica_id`'s stream, as the balancer routes it (its worker never reads it)."""
    stream = bus.names.worker_requests(replica_id)
    await ensure_group(bus.redis, stream, WORKER_GROUP)
    await bus.publish(stream, GenerateRequest(request_id="s/0", sample_id="s", prompt_token_ids=[1],
                                              max_tokens=4, replica_id=replica_id))


async def _results(bus: Bus, stream: str) -> list[GenerateResult]:
    """The first GenerateResults to reach `stream` (read as group 'check')."""
    while True:
        read = await bus.redis.xreadgroup("check", "t", {stream: ">"}, block=200)
        answered = [m for _, entries in read for _, fields in entries
                    if isinstance(m := decode(fields), GenerateResult)]
        if answered:
            return answered
