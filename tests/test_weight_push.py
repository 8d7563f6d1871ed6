"""What a weight push sends each worker (shared/weight_transfer.py, services/trainer/weight_push.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pickle

import pytest

from core.replica import WEIGHT_ACTIONS, IllegalReplicaTransition, ReplicaState, transition
from services.trainer.service import Trainer
from services.trainer.sim_backend import SimTrainer
from services.trainer.weight_push import StreamSyncClient
from shared.bus import Bus
from shared.names import Names
from shared.rpc import CommandClient
from shared.schema import Command, CommandAck, CommandAction, decode, encode
from shared.streams import connect
from shared.weight_transfer import init_info_for, push_groups, push_plan, wire_safe
from tests.stack import sim_config


def test_each_replica_joins_the_group_after_the_trainer_and_the_replicas_before_it():
    info = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 9}
    offsets = [init_info_for(info, i, replica_world_size=4)["rank_offset"] for i in range(2)]
    assert offsets == [1, 5]
    assert init_info_for(info, 1, replica_world_size=4)["world_size"] == 9


def test_an_init_without_ranks_is_sent_unchanged():
    assert init_info_for({"packed": True}, 3, replica_world_size=2) == {"packed": True}


def test_ipc_handles_travel_pickled_and_other_payloads_untouched():
    handles = [{"GPU-1": (bytes(8), 3, ("tuple", 1.5))}]
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]], "ipc_handles": handles}
    safe = wire_safe(info)
    assert "ipc_handles" not in safe and safe["names"] == ["w"]
    assert pickle.loads(base64.b64decode(safe["ipc_handles_pickled"])) == handles
    nccl = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}
    assert wire_safe(nccl) is nccl


@pytest.mark.parametrize("state", [ReplicaState.PAUSED, ReplicaState.SERVING])
@pytest.mark.parametrize("action", sorted(WEIGHT_ACTIONS))
def test_weight_commands_are_legal_while_awake_and_change_nothing(state, action):
    assert transition(state, action) is state


@pytest.mark.parametrize("action", sorted(WEIGHT_ACTIONS))
def test_a_weight_command_replayed_to_a_sleeping_replica_is_refused_and_wake_then_sync_still_works(action):
    with pytest.raises(IllegalReplicaTransition, match="while sleeping: wake it first"):
        transition(ReplicaState.SLEEPING, action)
    # the controller's order: wake, sync, resume
    awake = transition(ReplicaState.SLEEPING, CommandAction.WAKE)
    assert transition(transition(awake, action), CommandAction.RESUME) is ReplicaState.SERVING


def test_an_ipc_push_goes_to_one_replica_at_a_time_and_a_broadcast_to_the_whole_group():
    assert push_groups("ipc", ["hybrid_0", "hybrid_1"]) == [("hybrid_0",), ("hybrid_1",)]
    assert push_groups("nccl", ["standalone_0", "standalone_1"]) == [("standalone_0", "standalone_1")]
    assert push_groups("gloo", []) == []


def test_a_sync_that_also_pushes_the_hybrids_keeps_each_replica_in_its_own_roles_group():
    # vLLM's engine holds one transfer group: a folded sync (standalones and hybrids in one command) must
    # not form a group of both, which the next sync without the hybrids would replace
    roles = ({"standalone_0", "standalone_1"}, {"hybrid_0", "hybrid_1"})
    gloo = dict.fromkeys(("standalone_0", "standalone_1", "hybrid_0", "hybrid_1"), "gloo")
    assert push_plan(gloo, ["standalone_0", "standalone_1", "hybrid_0"], roles) == [
        ("gloo", ("standalone_0", "standalone_1")), ("gloo", ("hybrid_0",))]
    assert push_plan(gloo, ["standalone_0", "standalone_1"], roles) == [
        ("gloo", ("standalone_0", "standalone_1"))]
    mixed = {"standalone_0": "nccl", "standalone_1": "nccl", "hybrid_0": "ipc", "hybrid_1": "ipc"}
    assert push_plan(mixed, ["standalone_0", "standalone_1", "hybrid_0", "hybrid_1"], roles) == [
        ("nccl", ("standalone_0", "standalone_1")), ("ipc", ("hybrid_0",)), ("ipc", ("hybrid_1",))]
    filesystem_hybrids = {"standalone_0": "gloo", "hybrid_0": "filesystem"}
    assert push_plan(filesystem_hybrids, ["standalone_0", "hybrid_0"], roles) == [("gloo", ("standalone_0",))]


async def test_a_push_call_gives_up_at_once_when_a_target_worker_dies_instead_of_waiting_for_its_ack(
        redis_server):
    """No worker serves the command stream here, so only the heartbeat watch can end the call."""
    bus = Bus(connect(redis_server.url), Names("test"))
    rpc = CommandClient(bus, timeout_s=60.0, max_attempts=1)
    await rpc.start()
    beat = bus.names.worker_heartbeat("standalone_0")
    await bus.redis.set(beat, "incarnation-1", ex=30)
    client = StreamSyncClient(rpc=rpc, names=bus.names, loop=asyncio.get_running_loop(),
                              replica_ids=["standalone_0"], version=3, incarnations=("incarnation-1",))
    try:
        call = asyncio.create_task(asyncio.to_thread(client.start_weight_update))
        await asyncio.sleep(1.0)
        assert not call.done()  # alive, just slow: still waiting
        await bus.redis.set(beat, "incarnation-2", ex=30)  # the worker restarted
        stopped = "standalone_0's worker stopped or restarted during weights_start"
        with pytest.raises(ValueError, match=stopped):
            async with asyncio.timeout(5):
                await call
    finally:
        await rpc.close()
        await bus.redis.aclose()


async def test_a_hybrid_whose_ipc_push_fails_alone_reloads_from_disk_and_its_neighbour_keeps_its_push(
        redis_server):
    """hybrid_1 is not on the trainer's GPU: its own push fails; hybrid_0's succeeds and is not reloaded.
    The trainer's report says so, push by push (the controller counts and audits each push:
    test_orchestration_cores)."""
    config = sim_config()
    bus = Bus(connect(redis_server.url), Names(config.run.namespace))
    hybrids = ("hybrid_0", "hybrid_1")
    trainer = Trainer(bus=bus, config=config, backend=SimTrainer(config))
    trainer.transports = dict.fromkeys(hybrids, "ipc")
    pushed: list[tuple[str, ...]] = []
    reloaded: list[tuple[tuple[str, ...], list[bool], int, str]] = []

    async def push(replica_ids: tuple[str, ...], version: int, transport: str) -> str:
        pushed.append(replica_ids)
        return "" if replica_ids == ("hybrid_0",) else "RuntimeError: invalid device context"

    async def load(replica_ids: tuple[str, ...], alive: list[bool], version: int, weights_path: str) -> None:
        reloaded.append((replica_ids, alive, version, weights_path))

    trainer._push = push  # type: ignore[method-assign]
    trainer._load_from_filesystem = load  # type: ignore[method-assign]
    try:
        for hybrid in hybrids:
            await bus.redis.set(bus.names.worker_heartbeat(hybrid), "alive", ex=30)
            await bus.redis.set(bus.names.worker_serving(hybrid), "alive")  # done starting
        report = await trainer.sync_replicas(hybrids, 3, "/w/v3")
    finally:
        await bus.redis.aclose()
    assert pushed == [("hybrid_0",), ("hybrid_1",)]
    assert reloaded == [(("hybrid_1",), [True], 3, "/w/v3")]
    assert (report.pushed, report.ok, report.transport) == (True, False, "ipc")
    assert report.error == "RuntimeError: invalid device context"
    assert [(p.replica_ids, p.ok) for p in report.pushes] == [(["hybrid_0"], True), (["hybrid_1"], False)]
    assert decode(encode(CommandAck.answer(Command(command_id="c", action=CommandAction.SYNC_WEIGHTS),
                                           sender="trainer", report=report))).weights == report



async def test_a_gone_replica_is_left_out_of_the_push_group_and_sent_a_reload_for_its_return(redis_server):
    config = sim_config()
    bus = Bus(connect(redis_server.url), Names(config.run.namespace))
    standalones = ("standalone_0", "standalone_1")
    trainer = Trainer(bus=bus, config=config, backend=SimTrainer(config))
    trainer.transports = dict.fromkeys(standalones, "nccl")
    pushed: list[tuple[str, ...]] = []
    reloaded: list[tuple[tuple[str, ...], list[bool], int, str]] = []

    async def push(replica_ids: tuple[str, ...], version: int, transport: str) -> str:
        pushed.append(replica_ids)
        return ""

    async def load(replica_ids: tuple[str, ...], alive: list[bool], version: int, weights_path: str) -> None:
        reloaded.append((replica_ids, alive, version, weights_path))

    trainer._push = push  # type: ignore[method-assign]
    trainer._load_from_filesystem = load  # type: ignore[method-assign]
    try:
        await bus.redis.set(bus.names.worker_heartbeat("standalone_0"), "alive", ex=30)  # standalone_1: gone
        await bus.redis.set(bus.names.worker_serving("standalone_0"), "alive")
        report = await trainer.sync_replicas(standalones, 3, "/w/v3")
    finally:
        await bus.redis.aclose()
    assert pushed == [("standalone_0",)]
    assert reloaded == [(("standalone_1",), [False], 3, "/w/v3")]
    assert (report.pushed, report.ok, report.transport) == (True, True, "nccl")


async def test_a_push_call_returns_once_acked_even_when_redis_swallowed_the_cancel_of_its_watch(
        redis_server, monkeypatch):
    """Found by `bench.fidelity` with the fast mechanics: the initial push hung for ever after both workers
    had acked, because the call cancels its heartbeat watch when the acks are in and then awaits it, and
    redis-py can swallow a cancel that lands in a command (redis/redis-py#2028): the watch looped on."""
    bus = Bus(connect(redis_server.url), Names("test"))
    rpc = CommandClient(bus, timeout_s=30.0, max_attempts=1)
    await rpc.start()
    await bus.redis.set(bus.names.worker_heartbeat("standalone_0"), "incarnation-1", ex=30)
    real_mget = bus.redis.mget

    async def mget_that_swallows_a_cancel(keys):  # type: ignore[no-untyped-def]
        values = await real_mget(keys)
        with contextlib.suppress(asyncio.CancelledError):  # as redis-py can, while it reads the reply
            await asyncio.sleep(2.0)  # the ack lands meanwhile, and the call cancels its watch here
        return values

    monkeypatch.setattr(bus.redis, "mget", mget_that_swallows_a_cancel)
    commands = await bus.subscribe(bus.names.worker_commands("standalone_0"), "worker", "standalone_0")
    stop = asyncio.Event()

    async def acknowledge(command: Command) -> None:
        return None

    worker = asyncio.create_task(bus.serve_commands(commands, stop, sender="standalone_0", apply=acknowledge))
    client = StreamSyncClient(rpc=rpc, names=bus.names, loop=asyncio.get_running_loop(),
                              replica_ids=["standalone_0"], version=3, incarnations=("incarnation-1",))
    try:
        async with asyncio.timeout(15):
            await asyncio.to_thread(client.start_weight_update)
    finally:
        stop.set()
        await worker
        await commands.close()
        await rpc.close()
        await bus.redis.aclose()
