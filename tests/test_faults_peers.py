"""Waiting on a dead peer (real Redis): a command's wait ends when the peer's heartbeat lease
expires or its deadline passes, the caller does not fail, and the command is replayed when the
peer returns."""

from __future__ import annotations

import time

import pytest

from core import executor as ex
from services.controller.executor import Executor
from shared.bus import Bus
from shared.names import WORKER_GROUP, Names
from shared.peer_liveness import alive, mark_unresponsive, serving
from shared.rpc import CommandClient, PeerGone
from shared.schema import Command, CommandAction
from shared.streams import connect

REPLICA = "standalone_0"
LEASE_MS = 600


@pytest.fixture
async def bus(redis_server):
    redis = connect(redis_server.url)
    yield Bus(redis, Names("peers"))
    await redis.aclose()


async def test_a_call_to_a_peer_whose_heartbeat_expires_while_it_waits_ends_with_peer_gone(bus):
    names = bus.names
    rpc = CommandClient(bus, timeout_s=60.0, max_attempts=3)
    await rpc.start()
    await bus.redis.set(names.worker_heartbeat(REPLICA), b"1", px=LEASE_MS)  # dies: never renewed
    started = time.monotonic()
    with pytest.raises(PeerGone):
        await rpc.call(names.worker_commands(REPLICA), CommandAction.SLEEP,
                       lease_key=names.worker_heartbeat(REPLICA))
    assert time.monotonic() - started < 3.0  # the lease, not 3 x 60 s
    await rpc.close()

    returning = await bus.subscribe(names.worker_commands(REPLICA), WORKER_GROUP, REPLICA)
    replayed = [m for _, m in await returning.read(count=8, block_ms=0)]
    assert [c.action for c in replayed if isinstance(c, Command)] == [CommandAction.SLEEP]
    await returning.close()


async def test_the_controllers_executor_does_not_fail_when_a_worker_dies_during_a_command(bus):
    names = bus.names
    rpc = CommandClient(bus, timeout_s=60.0, max_attempts=3)
    await rpc.start()
    executor = Executor(bus=bus, rpc=rpc)
    await executor.start()
    await bus.redis.set(names.worker_heartbeat(REPLICA), b"1", px=LEASE_MS)
    started = time.monotonic()
    await executor.perform(ex.WorkerCall(replica_ids=(REPLICA,), action=CommandAction.WAKE))
    assert time.monotonic() - started < 3.0
    await executor.close()
    await rpc.close()
    assert await bus.redis.xlen(names.worker_commands(REPLICA)) == 1  # there for its return


async def test_a_live_peer_that_lets_a_command_pass_its_deadline_counts_as_gone_until_it_restarts(bus):
    names = bus.names
    beat = names.worker_heartbeat(REPLICA)
    rpc = CommandClient(bus, timeout_s=60.0, max_attempts=3)
    await rpc.start()
    await bus.redis.set(beat, b"hung-incarnation", ex=30)  # beats, never acks
    started = time.monotonic()
    acks = await rpc.call_peers([(names.worker_commands(REPLICA), beat)], CommandAction.WAKE, deadline_s=0.6)
    assert acks == [None] and time.monotonic() - started < 3.0  # its deadline, not 3 x 60 s
    await rpc.close()
    assert await alive(bus.redis, names, [beat]) == [False]
    await bus.redis.set(beat, b"restarted-incarnation", ex=30)
    assert await alive(bus.redis, names, [beat]) == [True]


async def test_a_replica_is_serving_only_while_the_incarnation_beating_wrote_serving_and_answers(bus):
    names, redis = bus.names, bus.redis
    replicas = ["standalone_0", "standalone_1", "standalone_2", "standalone_3"]
    beats = {r: names.worker_heartbeat(r) for r in replicas}
    await redis.set(beats["standalone_0"], b"a", ex=30)  # beating, still starting its engine
    await redis.set(beats["standalone_1"], b"b", ex=30)  # beating and done starting
    await redis.set(names.worker_serving("standalone_1"), b"b")
    await redis.set(beats["standalone_2"], b"c2", ex=30)  # restarted: serving was its last incarnation's
    await redis.set(names.worker_serving("standalone_2"), b"c1")
    await redis.set(names.worker_serving("standalone_3"), b"d")  # wrote serving, then its beat expired
    assert await serving(redis, names, replicas) == [False, True, False, False]
    assert await alive(redis, names, list(beats.values())) == [True, True, True, False]
    await mark_unresponsive(redis, names, beats["standalone_1"], b"b")
    assert await serving(redis, names, replicas) == [False, False, False, False]
    assert await alive(redis, names, list(beats.values())) == [True, False, True, False]
    assert await serving(redis, names, []) == [] and await alive(redis, names, []) == []
