"""Poison entries in a running sim stack (real Redis), on every stream a service reads with a consumer
group: each is dead-lettered alone with the exception as its reason, nothing innocent is, and the run
finishes with every fed sample trained."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.launcher import LOST
from shared.names import AccountingField
from tests.stack import Stack, consumer_group_streams, sim_config

pytestmark = pytest.mark.e2e

POISON: list[dict[str, Any]] = [
    {"type": b"\xff"},                       # a type tag of invalid UTF-8
    {"type": "sample", "payload": b"\x05"},  # a payload that is a bare number
    {"type": "sample", "payload": b"\x81\xa1x"},  # a truncated msgpack map
    {"type": "sample", "sample_id": "s", "payload": b"\x81\xactrajectories\x05"},  # wrong payload type
]


async def test_poison_entries_are_dead_lettered_alone_and_the_run_still_finishes(redis_server):
    stack = Stack(sim_config(), redis_server.url)
    await stack.start()
    try:
        redis = stack.buses[0].redis
        names = stack.names
        await asyncio.sleep(0.3)  # the services are reading now
        poisoned = [await redis.xadd(stream, fields)
                    for stream in consumer_group_streams(names, ("standalone_0", "hybrid_0"))
                    for fields in POISON]
        # controller:acks is read without a consumer group: skipped (logged), never fatal
        for fields in POISON:
            await redis.xadd(names.controller_acks, fields)
        await stack.wait_done(timeout_s=90)
        dead: Any = await redis.xrange(names.dead_letters)
        counts = await stack.accounting()
    finally:
        await stack.close()
    assert sorted(f[b"dlq_id"] for _, f in dead) == sorted(poisoned)
    assert all(f[b"dlq_reason"].startswith(b"malformed:") for _, f in dead)
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64 and counts[LOST] == 0

