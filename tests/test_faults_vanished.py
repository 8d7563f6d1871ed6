"""Queued samples whose MessageQueue entry vanishes (an operator's XTRIM, XDEL or DEL, a group destroyed or
moved past them, an entry dead-lettered after too many deliveries) are generated again, so the run finishes
with every fed sample trained once instead of waiting for them for good (services/trainer/vanished.py).
The script's own rules are checked against a real Redis; the faults against the real services."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aredis

from services.launcher import DUPLICATED, LOST
from services.trainer.vanished import requeue_vanished
from shared.bus import text
from shared.names import TRAINER_GROUP, AccountingField, Names, SampleState
from shared.schema import Regenerate, decode
from shared.streams import ensure_group, group_lag
from tests.stack import Stack, sim_config

NAMES = Names("vanish")


async def queue(redis: aredis.Redis, *sample_ids: str) -> list[bytes]:
    """Queue samples as the rollouter does: an entry in the MessageQueue, state and count `queued`."""
    entry_ids = [await redis.xadd(NAMES.mq, {"type": "sample", "sample_id": sid}) for sid in sample_ids]
    for sample_id in sample_ids:
        await redis.hset(NAMES.sample_states, sample_id, SampleState.QUEUED)
    await redis.hincrby(NAMES.accounting, AccountingField.QUEUED, len(sample_ids))
    return entry_ids


async def states(redis: aredis.Redis) -> dict[str, str]:
    return {text(k): text(v) for k, v in (await redis.hgetall(NAMES.sample_states)).items()}


async def test_queued_samples_still_deliverable_pending_or_held_are_left_alone(redis_client):
    await ensure_group(redis_client, NAMES.mq, TRAINER_GROUP)
    a, _, _ = await queue(redis_client, "a", "b", "c")
    await redis_client.xreadgroup(TRAINER_GROUP, "trainer", {NAMES.mq: ">"}, count=2)  # a, b: pending
    await redis_client.xdel(NAMES.mq, a)  # a: in the trainer's hands; b: pending; c: not delivered yet
    assert await requeue_vanished(redis_client, NAMES, held=[(a, "a")]) == []
    assert set((await states(redis_client)).values()) == {SampleState.QUEUED}


async def test_a_queued_sample_without_an_entry_goes_back_to_generating_with_one_regenerate_entry(
        redis_client):
    await ensure_group(redis_client, NAMES.mq, TRAINER_GROUP)
    a, b, _ = await queue(redis_client, "a", "b", "c")
    await redis_client.xreadgroup(TRAINER_GROUP, "trainer", {NAMES.mq: ">"}, count=2)  # a, b: pending
    await redis_client.xdel(NAMES.mq, a)  # deleted while pending, and not in the trainer's hands
    await redis_client.xgroup_setid(NAMES.mq, TRAINER_GROUP, "$")  # c skipped: never deliverable
    assert await requeue_vanished(redis_client, NAMES, held=[(b, "b")]) == ["a", "c"]
    assert await requeue_vanished(redis_client, NAMES, held=[(b, "b")]) == []  # once only
    entries: Any = await redis_client.xrange(NAMES.rollouter_regenerate)
    accounting = {text(k): int(v) for k, v in (await redis_client.hgetall(NAMES.accounting)).items()}
    assert [decode(fields) for _, fields in entries] == [Regenerate(sample_id="a"), Regenerate(sample_id="c")]
    assert await states(redis_client) == {"a": SampleState.GENERATING, "b": SampleState.QUEUED,
                                          "c": SampleState.GENERATING}
    assert accounting == {AccountingField.QUEUED: 1, AccountingField.GENERATING: 2,
                          AccountingField.VANISHED: 2}


async def test_a_deleted_message_queue_sends_every_queued_sample_not_held_back(redis_client):
    await ensure_group(redis_client, NAMES.mq, TRAINER_GROUP)
    a, _ = await queue(redis_client, "a", "b")
    await redis_client.xreadgroup(TRAINER_GROUP, "trainer", {NAMES.mq: ">"}, count=1)
    await redis_client.delete(NAMES.mq)
    assert await requeue_vanished(redis_client, NAMES, held=[(a, "a")]) == ["b"]


async def test_a_check_sets_the_groups_lag_back_to_the_entries_left_after_unread_ones_were_trimmed(
        redis_client):
    """Redis 7 keeps entries deleted before the group read them in its lag for good: mq_size then
    overstates the queue and pauses the rollouter on a queue that is empty."""
    await ensure_group(redis_client, NAMES.mq, TRAINER_GROUP)
    await queue(redis_client, "a", "b", "c")
    await redis_client.xreadgroup(TRAINER_GROUP, "trainer", {NAMES.mq: ">"}, count=1)
    await redis_client.xtrim(NAMES.mq, maxlen=0)  # b and c deleted unread
    (d,) = await queue(redis_client, "d")
    await redis_client.xreadgroup(TRAINER_GROUP, "trainer", {NAMES.mq: ">"}, count=1)
    await requeue_vanished(redis_client, NAMES, held=[(d, "d")])
    await queue(redis_client, "e")
    assert await group_lag(redis_client, NAMES.mq, TRAINER_GROUP) == 1


async def run_with(redis_server, fault: str) -> dict[str, int]:
    """A sim run whose MessageQueue meets `fault` once samples are queued; its sample counts."""
    stack = Stack(sim_config(), redis_server.url)
    await stack.start()
    try:
        redis, names = stack.buses[0].redis, stack.names
        while int(await redis.hget(names.accounting, AccountingField.QUEUED) or 0) < 4:
            await asyncio.sleep(0.01)
        if fault == "trim":
            await redis.xtrim(names.mq, maxlen=0)
        else:
            await redis.delete(names.mq)
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
        vanished = await redis.hget(names.accounting, AccountingField.VANISHED)
        counts[AccountingField.VANISHED] = int(vanished or 0)
    finally:
        await stack.close()
    return counts


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["trim", "delete"])
async def test_a_message_queue_trimmed_or_deleted_mid_run_is_refilled_and_the_run_trains_every_sample_once(
        redis_server, fault):
    counts = await run_with(redis_server, fault)
    assert counts[AccountingField.VANISHED] >= 1
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0


async def test_a_queued_count_that_drifted_above_the_queued_samples_is_set_right_by_one_check(redis_client):
    await ensure_group(redis_client, NAMES.mq, TRAINER_GROUP)
    await queue(redis_client, "a")
    await redis_client.hincrby(NAMES.accounting, AccountingField.QUEUED, 5)  # e.g. a write lost in a crash
    assert await requeue_vanished(redis_client, NAMES, held=[]) == []
    assert int(await redis_client.hget(NAMES.accounting, AccountingField.QUEUED)) == 1
