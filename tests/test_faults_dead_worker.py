"""Rollout workers that die for good, die during start-up, or hang (real Redis; real processes where
a process is killed): the controller's waits end by the worker's lease or by a per-command deadline,
the controller never crashes, and the run finishes on the remaining replicas with every fed sample
trained once (checked per sample id)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from core.replica import ReplicaState
from services.launcher import DUPLICATED, LOST
from services.rollout_worker.sim_engine import SimEngine
from services.rollout_worker.worker import RolloutWorker
from shared.bus import text
from shared.config import config_to_dict
from shared.names import AccountingField, Names
from shared.names import TrainerStateField as F
from shared.peer_liveness import alive
from shared.rpc import CommandClient, CommandFailed
from shared.schema import CommandAction
from shared.streams import connect
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e
SAMPLES = 96


async def _serving(stack: Stack, replica_id: str) -> None:
    """Until `replica_id` serves, at weight version >= 2 (mid-run). A hybrid serves only when the
    policy activates it, which this short run's queue may never ask for: the admin's forced
    activation (applied at the next sync) makes it serve, as an operator would."""
    redis = stack.buses[0].redis
    assert stack.controller is not None
    while not text(await redis.hget(stack.names.replica_states, replica_id) or b"").startswith("serving") \
            or int(await redis.hget(stack.names.trainer_state, F.VERSION) or 0) < 2:
        if replica_id.startswith("hybrid") and stack.controller.core.pending_force is None:
            await stack.controller.force(activate=True)
        await asyncio.sleep(0.01)


def _assert_trained_once(counts: dict[str, int]) -> None:
    assert counts[AccountingField.TRAINED] == SAMPLES and counts[LOST] == 0 and counts[DUPLICATED] == 0


@pytest.mark.parametrize("replica_id", ["hybrid_0", "standalone_0"])
async def test_a_worker_killed_for_good_while_serving_never_stalls_the_run(redis_server, tmp_path,
                                                                          replica_id):
    config = sim_config(data={"total_rollout_steps": SAMPLES})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(config)))
    stack = Stack(config, redis_server.url)
    worker = subprocess.Popen([sys.executable, "-m", "services.rollout_worker", "--config", str(config_path),
                               "--redis-url", redis_server.url, "--log-level", "WARNING",
                               "--replica-id", replica_id])
    await stack.start(without=(replica_id,))
    try:
        await asyncio.wait_for(_serving(stack, replica_id), timeout=60)
        worker.send_signal(signal.SIGKILL)  # and never restarted
        worker.wait()
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
    finally:
        worker.kill()
        await stack.close()
    _assert_trained_once(counts)


async def test_a_worker_killed_during_a_blocking_engine_start_is_gone_within_its_heartbeat_ttl(redis_server):
    # vLLM's engine start blocks the event loop for tens of seconds: the start-up heartbeat is a thread.
    names = Names("startup")
    key = names.worker_heartbeat("hybrid_0")
    ttl_s = 2
    starting = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom services.rollout_worker.startup import StartupHeartbeat\n"
        f"with StartupHeartbeat({redis_server.url!r}, {{{key!r}: 'inc-1'}}, ttl_s={ttl_s}):\n"
        "    time.sleep(600)  # a blocking engine start\n")])
    redis = connect(redis_server.url)
    try:
        deadline = time.monotonic() + 30
        while not await redis.exists(key):
            assert time.monotonic() < deadline and starting.poll() is None
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.5 * ttl_s)
        assert await alive(redis, names, [key]) == [True]  # renewed while the start blocks
        starting.send_signal(signal.SIGKILL)
        starting.wait()
        killed = time.monotonic()
        while await alive(redis, names, [key]) == [True]:
            await asyncio.sleep(0.05)
        assert time.monotonic() - killed <= ttl_s + 0.5  # its TTL, not a long start-up lease
    finally:
        starting.kill()
        await redis.aclose()


class HungEngine(SimEngine):
    """An engine that hangs in wake (a stuck GPU call) until `until` is set: its worker still
    beats, and does not ack."""

    def __init__(self, *, until: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.until = until

    async def wake(self) -> None:
        await self.until.wait()


async def test_a_live_worker_that_never_acks_is_marked_unresponsive_and_the_run_goes_on(redis_server):
    config = sim_config(data={"total_rollout_steps": SAMPLES})
    stack = Stack(config, redis_server.url)
    stack.start_controller().executor.worker_deadline_s = 2.0  # set before its task first runs
    await stack.start(without=("controller", "hybrid_0"))
    recovered = asyncio.Event()
    engine = HungEngine(until=recovered, config=config, hybrid=True)
    await engine.start()
    hung = RolloutWorker(bus=stack.bus(), replica_id="hybrid_0", engine=engine,
                         initial_state=ReplicaState.SLEEPING)
    stack.tasks["hybrid_0"] = asyncio.create_task(hung.run(stack.stop))
    try:
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
        redis = stack.buses[0].redis
        beat = stack.names.worker_heartbeat("hybrid_0")
        marked = await redis.hget(stack.names.unresponsive, beat)
        assert marked == await redis.get(beat) == hung.incarnation.encode()  # still beating, but gone
        recovered.set()  # the engine recovers: the next command it applies clears the mark
        async with asyncio.timeout(10):
            while await alive(redis, stack.names, [beat]) != [True]:
                await asyncio.sleep(0.05)
    finally:
        recovered.set()
        await stack.close()
    _assert_trained_once(counts)


async def test_a_weight_sync_sends_a_worker_still_starting_its_engine_a_reload_without_waiting(redis_server):
    # A vLLM start under load can outlast every ack deadline: the worker beats while it starts, but
    # a sync must not wait for it; it replays the reload once its engine is up.
    config = sim_config()
    stack = Stack(config, redis_server.url)
    trainer = stack.start_trainer()
    redis = stack.bus().redis
    names = stack.names
    await redis.set(names.worker_heartbeat("standalone_0"), "inc-1", ex=60)  # its start-up heartbeat
    try:
        await asyncio.sleep(0.5)  # the trainer's command client starts with its loop
        async with asyncio.timeout(10):
            await trainer.sync_replicas(("standalone_0",), 1, "")
        engine = SimEngine(config=config, hybrid=False)
        await engine.start()  # the engine is up: the worker starts serving
        worker = RolloutWorker(bus=stack.bus(), replica_id="standalone_0", engine=engine,
                               initial_state=ReplicaState.SERVING, incarnation="inc-1")
        stack.tasks["standalone_0"] = asyncio.create_task(worker.run(stack.stop))
        async with asyncio.timeout(10):
            while worker.version < 1:  # the reload sent while it started, replayed
                await asyncio.sleep(0.05)
        assert await redis.get(names.worker_serving("standalone_0")) == b"inc-1"
        async with asyncio.timeout(10):  # serving now: the next sync is awaited, and acked
            report = await trainer.sync_replicas(("standalone_0",), 2, "")
        assert report.ok and worker.version == 2
    finally:
        await stack.close()


async def test_a_fresh_controller_answers_the_trainer_only_once_every_worker_has_started(redis_server):
    config = sim_config(data={"total_rollout_steps": SAMPLES})
    stack = Stack(config, redis_server.url)
    await stack.start(without=("hybrid_0",))
    try:
        await asyncio.sleep(1.0)  # the hybrid's worker is still starting (a vLLM engine: tens of s)
        assert await stack.buses[0].redis.xlen(stack.names.trainer_replies) == 0
        engine = SimEngine(config=config, hybrid=True)
        await engine.start()
        worker = RolloutWorker(bus=stack.bus(), replica_id="hybrid_0", engine=engine,
                               initial_state=ReplicaState.SLEEPING)
        stack.tasks["hybrid_0"] = asyncio.create_task(worker.run(stack.stop))
        await stack.wait_done(timeout_s=60)
        counts = await stack.accounting()
    finally:
        await stack.close()
    _assert_trained_once(counts)


async def test_a_worker_that_never_starts_delays_a_fresh_run_by_the_start_timeout_only(redis_server):
    config = sim_config(data={"total_rollout_steps": SAMPLES}, rollout={"worker_start_timeout_s": 1.0})
    stack = Stack(config, redis_server.url)
    started = time.monotonic()
    await stack.start(without=("hybrid_0",))
    try:
        while not await stack.buses[0].redis.xlen(stack.names.trainer_replies):
            await asyncio.sleep(0.01)
        first_reply_after_s = time.monotonic() - started
        await stack.wait_done(timeout_s=60)
        counts = await stack.accounting()
    finally:
        await stack.close()
    _assert_trained_once(counts)
    assert 1.0 <= first_reply_after_s < 5.0


@pytest.mark.parametrize(("published", "expected"), [
    ("paused:2", ReplicaState.SERVING),  # awake before the crash: the activation's resume is legal
    ("sleeping:2", None),  # asleep before the crash: a resume is refused, as it was then
    ("bogus", None),  # unreadable: the fresh start's state
])
async def test_a_restarted_worker_takes_up_the_state_its_last_incarnation_published(
        redis_server, published: str, expected: ReplicaState | None) -> None:
    # A hybrid killed after its wake was acked used to come back asleep, refuse the activation's
    # weight sync and resume, and the refusal stopped the controller.
    config = sim_config()
    stack = Stack(config, redis_server.url)
    bus = stack.bus()
    await bus.redis.hset(stack.names.replica_states, "hybrid_0", published)
    engine = SimEngine(config=config, hybrid=True)
    await engine.start()
    worker = RolloutWorker(bus=stack.bus(), replica_id="hybrid_0", engine=engine,
                           initial_state=ReplicaState.SLEEPING)
    stack.tasks["hybrid_0"] = asyncio.create_task(worker.run(stack.stop))
    rpc = CommandClient(bus, timeout_s=10, max_attempts=1)
    await rpc.start()
    try:
        if expected is None:
            with pytest.raises(CommandFailed, match="while sleeping"):
                await rpc.call(stack.names.worker_commands("hybrid_0"), CommandAction.RESUME)
        else:
            ack = await rpc.call(stack.names.worker_commands("hybrid_0"), CommandAction.RESUME)
            assert ack.ok and worker.state is expected
    finally:
        await rpc.close()
        await stack.close()


async def test_a_command_client_closed_after_a_call_stops_its_reader_within_a_second(redis_server) -> None:
    # redis-py swallowed the cancel of the reader's blocking XREAD here (it read again), and close()
    # waited for ever; the reader now also stops at its next read's end.
    config = sim_config()
    stack = Stack(config, redis_server.url)
    engine = SimEngine(config=config, hybrid=True)
    await engine.start()
    worker = RolloutWorker(bus=stack.bus(), replica_id="hybrid_0", engine=engine,
                           initial_state=ReplicaState.SLEEPING)
    stack.tasks["hybrid_0"] = asyncio.create_task(worker.run(stack.stop))
    rpc = CommandClient(stack.bus(), timeout_s=10, max_attempts=1)
    await rpc.start()
    try:
        await rpc.call(stack.names.worker_commands("hybrid_0"), CommandAction.WAKE)
        started = time.monotonic()
        async with asyncio.timeout(5):
            await rpc.close()
        assert time.monotonic() - started < 1.5
    finally:
        await stack.close()
