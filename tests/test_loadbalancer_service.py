"""The load balancer service against a real Redis (no other services running)."""

from __future__ import annotations

from services.loadbalancer.service import LoadBalancer
from shared.bus import Bus
from shared.names import WORKER_GROUP, Names
from shared.schema import GenerateRequest
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
