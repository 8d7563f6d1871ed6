"""Nothing twice, by per-sample state (real Redis, sim stack): a copy of a sample already trained and
a sample with an id the rollouter never queued are dead-lettered with a reason, never trained; every
step still gets its full batch; the per-sample states say every fed sample was trained once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from core.replica import ReplicaState, transition
from services.launcher import DUPLICATED, LOST
from shared.bus import Bus, text
from shared.names import WORKER_GROUP, AccountingField, Names, SampleState, TrainerStateField
from shared.schema import Command, CommandAck, CommandAction, CycleMetrics, ReplicaReport, decode
from tests.stack import Stack, consumer_group_streams, sim_config

pytestmark = pytest.mark.e2e
REPLAY_ROUNDS = 12
"""Rounds of copies, 150 ms apart: about as long as the sim run takes."""


async def first_trained_entry(stack: Stack, timeout_s: float = 30.0) -> dict[bytes, bytes]:
    redis = stack.buses[0].redis
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, fields in await redis.xrange(stack.names.mq):
            state = await redis.hget(stack.names.sample_states, fields[b"sample_id"])
            if state is not None and text(state) == SampleState.TRAINED:
                return dict(fields)
        await asyncio.sleep(0.05)
    raise TimeoutError("no sample trained")


async def test_a_copy_of_a_trained_sample_and_a_foreign_sample_are_dead_lettered_never_trained(redis_server):
    stack = Stack(sim_config(), redis_server.url)
    await stack.start()
    try:
        redis, names = stack.buses[0].redis, stack.names
        trained = await first_trained_entry(stack)
        copy_id = await redis.xadd(names.mq, trained)  # byte-identical
        foreign_id = await redis.xadd(names.mq, {**trained, b"sample_id": b"foreign-1"})
        await stack.wait_done(timeout_s=90)
        dead: Any = await redis.xrange(names.dead_letters)
        counts = await stack.accounting()
        states = {text(k): text(v) for k, v in (await redis.hgetall(names.sample_states)).items()}
        steps = int(text(await redis.hget(names.trainer_state, TrainerStateField.GLOBAL_STEPS) or b"0"))
    finally:
        await stack.close()
    reasons = {f[b"dlq_id"]: text(f[b"dlq_reason"]) for _, f in dead}
    assert set(reasons) == {copy_id, foreign_id}
    assert reasons[copy_id].startswith("duplicate: ") and reasons[foreign_id].startswith("unknown sample id")
    assert "foreign-1" not in states
    assert len(states) == 64 and set(states.values()) == {SampleState.TRAINED}
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
    assert steps == 64 // 4 + 1  # every micro-step got a full batch of real samples


async def test_copies_of_the_newest_entry_of_every_stream_replayed_mid_run_are_absorbed(redis_server):
    """Redelivery everywhere at once: the newest entry of every stream a service reads with a consumer
    group (samples, requests, results, commands, the trainer's events and replies) is added again, every
    150 ms while the run goes on. A copied sample is dead-lettered as a duplicate; every other copy is
    taken as the idempotent repeat it is (nothing else is dead-lettered), and the run ends with every
    fed sample trained once."""
    stack = Stack(sim_config(), redis_server.url)
    await stack.start()
    copied: set[str] = set()
    try:
        redis, names = stack.buses[0].redis, stack.names
        streams = consumer_group_streams(names, ("standalone_0", "hybrid_0"))
        for _ in range(REPLAY_ROUNDS):
            await asyncio.sleep(0.15)
            for stream in streams:
                for _, fields in await redis.xrevrange(stream, count=1):
                    await redis.xadd(stream, fields)
                    copied.add(stream)
        await stack.wait_done(timeout_s=90)
        dead: Any = await redis.xrange(names.dead_letters)
        counts = await stack.accounting()
    finally:
        await stack.close()
    assert {names.mq, names.trainer_events, names.lb_requests, names.rollouter_commands} <= copied
    assert all(text(f[b"dlq_stream"]) == names.mq and text(f[b"dlq_reason"]).startswith("duplicate: ")
               for _, f in dead)
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0


async def test_a_stale_copy_of_a_sleep_command_replayed_after_the_wake_is_acked_again_never_applied(
        redis_client):
    """Commands are applied once per command_id: a copy of SLEEP that arrives after the WAKE that
    followed it gets the SLEEP's first ack again and leaves the replica awake (applied again, it
    would put an active hybrid to sleep and fail the next weight sync)."""
    names = Names("once")
    bus = Bus(redis_client, names)
    state = ReplicaState.SERVING
    applied: list[CommandAction] = []

    async def apply(command: Command) -> ReplicaReport:
        nonlocal state
        state = transition(state, command.action)
        applied.append(command.action)
        return ReplicaReport(state=state, version=0, duration_s=0.0)

    stream = names.worker_commands("hybrid_0")
    sub = await bus.subscribe(stream, WORKER_GROUP, "hybrid_0")
    stop = asyncio.Event()
    server = asyncio.create_task(bus.serve_commands(sub, stop, sender="hybrid_0", apply=apply))
    sleep = Command(command_id="sleep-1", action=CommandAction.SLEEP)
    try:
        for command in (sleep, Command(command_id="wake-1", action=CommandAction.WAKE),
                        Command(command_id="resume-1", action=CommandAction.RESUME), sleep):
            await bus.publish(stream, command)
        deadline = time.monotonic() + 10
        while await redis_client.xlen(names.controller_acks) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await server
        await sub.close()
    acks = [decode(fields) for _, fields in await redis_client.xrange(names.controller_acks)]
    assert all(isinstance(ack, CommandAck) and ack.ok for ack in acks)
    assert [ack.command_id for ack in acks] == ["sleep-1", "wake-1", "resume-1", "sleep-1"]
    assert acks[0] == acks[3]
    assert applied == [CommandAction.SLEEP, CommandAction.WAKE, CommandAction.RESUME]
    assert state is ReplicaState.SERVING


async def test_late_copies_of_every_trainer_event_so_far_are_ignored_by_the_controller(redis_server):
    """Copies of old step-phase events (the first sync, micro-steps already done) appended mid-run are
    not handled again: each cycle's metrics are emitted once, and every fed sample is trained once."""
    stack = Stack(sim_config(), redis_server.url)
    await stack.start()
    try:
        redis, names = stack.buses[0].redis, stack.names
        deadline = time.monotonic() + 30
        while await redis.xlen(names.metrics) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        old = await redis.xrange(names.trainer_events)
        for _, fields in old:
            await redis.xadd(names.trainer_events, fields)
        await stack.wait_done(timeout_s=90)
        metrics = [decode(fields) for _, fields in await redis.xrange(names.metrics)]
        counts = await stack.accounting()
    finally:
        await stack.close()
    assert len(old) >= 8
    versions = [m.version for m in metrics if isinstance(m, CycleMetrics)]
    assert len(versions) == len(set(versions)) == 64 // 4 // 2
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
