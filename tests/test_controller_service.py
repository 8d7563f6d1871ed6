"""The controller's weight sync over a real Redis: one command to the trainer, one typed report back.

The trainer owns the sync end to end (push, filesystem fallback); the controller never
reads the trainer's event stream in the middle of handling an event.
"""

from __future__ import annotations

import asyncio
import time

from core import executor as ex
from core.sample_lifecycle import RolloutStatus
from services.controller.executor import Executor
from services.trainer.service import Trainer
from services.trainer.sim_backend import SimTrainer
from shared.bus import Bus
from shared.names import TRAINER_GROUP, WORKER_GROUP, Names
from shared.rpc import CommandClient
from shared.schema import Command, CommandAction
from shared.streams import connect
from tests.stack import sim_config


async def test_a_weight_sync_is_one_trainer_command_whose_failed_push_falls_back_to_the_filesystem(
        redis_server):
    """The sim trainer cannot push: the trainer reports the failed push and has every replica
    reload the version from the filesystem before it answers."""
    config = sim_config()
    names = Names(config.run.namespace)
    bus = Bus(connect(redis_server.url), names)
    trainer = Trainer(bus=bus, config=config, backend=SimTrainer(config))
    trainer.transports = {"standalone_0": "gloo"}
    rpc = CommandClient(bus)
    executor = Executor(bus=bus, rpc=rpc)
    stop = asyncio.Event()
    trainer_commands = await bus.subscribe(names.trainer_commands, TRAINER_GROUP, "trainer")
    worker_commands = await bus.subscribe(names.worker_commands("standalone_0"), WORKER_GROUP, "standalone_0")
    await bus.redis.set(names.worker_heartbeat("standalone_0"), "incarnation-1")
    await bus.redis.set(names.worker_serving("standalone_0"), "incarnation-1")  # done starting
    reloads: list[Command] = []

    async def reload(command: Command) -> None:
        reloads.append(command)

    for client in (trainer._rpc, trainer._push_rpc, rpc, executor.trainer_rpc):
        await client.start()
    servers = [
        asyncio.create_task(bus.serve_commands(trainer_commands, stop, sender="t", apply=trainer._apply)),
        asyncio.create_task(bus.serve_commands(worker_commands, stop, sender="w", apply=reload)),
    ]
    try:
        report = await executor.perform(ex.SyncReplicas(replica_ids=("standalone_0",), version=0,
                                                        weights_path="/w/0"))
        assert (report.pushed, report.ok, report.transport) == (True, False, "gloo")
        assert report.error.startswith("ValueError")
        assert [(c.action, c.version, c.weights_path) for c in reloads] == [
            (CommandAction.UPDATE_WEIGHTS, 0, "/w/0")]
        await executor.perform(ex.ReleaseTrainer())  # the trainer's other commands are served alike
        assert trainer.backend.on_gpu is False  # type: ignore[attr-defined]
        await executor.perform(ex.AcquireTrainer())
        assert trainer.backend.on_gpu is True  # type: ignore[attr-defined]
    finally:
        stop.set()
        await asyncio.gather(*servers)
        for client in (trainer._rpc, trainer._push_rpc, rpc, executor.trainer_rpc):
            await client.close()
        for sub in (trainer_commands, worker_commands):
            await sub.close()
        await bus.redis.aclose()


async def test_a_progress_reading_takes_the_rollouters_idle_seconds_from_its_published_status(redis_server):
    """The rollouter publishes its closed idle seconds and when its open idle window began; the
    controller's reading adds the open window up to now, so its rates can leave idle capacity out."""
    config = sim_config()
    names = Names(config.run.namespace)
    bus = Bus(connect(redis_server.url), names)
    executor = Executor(bus=bus, rpc=CommandClient(bus))
    try:
        started = time.time() - 4.0
        await bus.redis.hset(names.rollouter_state, mapping=RolloutStatus(
            paused=True, active_tasks=0, feed_done=False, idle_closed_s=6.0, idle_since_s=started).to_hash())
        idle = (await executor.perform(ex.ReadProgress())).idle_s
        assert 10.0 <= idle < 10.0 + (time.time() - started - 4.0) + 0.001
        await bus.redis.hset(names.rollouter_state, mapping=RolloutStatus(
            paused=False, active_tasks=3, feed_done=False, idle_closed_s=10.5).to_hash())
        assert (await executor.perform(ex.ReadProgress())).idle_s == 10.5
    finally:
        await bus.redis.aclose()
