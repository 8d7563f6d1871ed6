"""Nothing twice, by per-sample state (real Redis, sim stack): a copy of a sample already trained and
a sample with an id the rollouter never queued are dead-lettered with a reason, never trained; every
step still gets its full batch; the per-sample states say every fed sample was trained once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from services.launcher import DUPLICATED, LOST
from shared.bus import text
from shared.names import AccountingField, SampleState, TrainerStateField
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
