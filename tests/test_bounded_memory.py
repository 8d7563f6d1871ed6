"""Bounded memory (real Redis): readers trim what every group has acked (XTRIM MINID), never an
entry still pending or not yet read; dead letters keep a capped copy; after a whole sim run with
retention 0 the MessageQueue and the command streams hold nothing."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aredis

from services.launcher import LOST
from shared.names import DEAD_LETTER_FIELD_MAX_BYTES, AccountingField
from shared.stream_groups import trim_acked
from shared.streams import StreamConsumer, connect, ensure_group, xadd_many
from tests.conftest import RedisServer
from tests.stack import Stack, sim_config

STREAM = "t:mq"


async def ids(r: aredis.Redis) -> list[bytes]:
    return [entry_id for entry_id, _ in await r.xrange(STREAM)]


async def test_trimming_keeps_every_entry_a_group_has_pending_or_not_yet_read(
        redis_client: aredis.Redis) -> None:
    written = await xadd_many(redis_client, STREAM, ({b"i": str(i)} for i in range(10)))
    for group in ("fast", "slow"):
        await ensure_group(redis_client, STREAM, group)
    fast = StreamConsumer(redis_client, stream=STREAM, group="fast", consumer="f", retention_s=0)
    slow = StreamConsumer(redis_client, stream=STREAM, group="slow", consumer="s", retention_s=0)
    await fast.ack(e.entry_id for e in await fast.read(10, block_ms=0))  # fast: all 10 acked
    taken = await slow.read(6, block_ms=0)  # slow: 0..5 delivered
    await slow.ack(e.entry_id for e in taken[:2] + taken[3:])  # 2 still pending
    assert await trim_acked(redis_client, STREAM, retention_s=0) == 2
    assert await ids(redis_client) == written[2:], "slow's pending entry 2 and unread 6..9 stay"
    await slow.ack([taken[2].entry_id])
    assert await trim_acked(redis_client, STREAM, retention_s=0) == 4
    assert await ids(redis_client) == written[6:]
    assert await trim_acked(redis_client, STREAM, retention_s=3600) == 0, "younger than the retention: kept"
    await fast.aclose()
    await slow.aclose()


async def test_a_stream_without_groups_or_without_entries_is_left_alone(redis_client: aredis.Redis) -> None:
    assert await trim_acked(redis_client, STREAM, retention_s=0) == 0
    await redis_client.xadd(STREAM, {"i": "0"})
    assert await trim_acked(redis_client, STREAM, retention_s=0) == 0
    assert await redis_client.xlen(STREAM) == 1


async def test_a_dead_letter_keeps_a_capped_copy_in_a_capped_stream(redis_client: aredis.Redis) -> None:
    big = b"x" * (DEAD_LETTER_FIELD_MAX_BYTES * 4)
    await xadd_many(redis_client, STREAM, ({b"i": str(i), b"payload": big} for i in range(300)))
    consumer = StreamConsumer(redis_client, stream=STREAM, group="g", consumer="c", dead_letter_maxlen=100)
    await consumer.start()
    for entry in await consumer.read(300, block_ms=0):
        await consumer.dead_letter(entry, reason="test")
    rows: Any = await redis_client.xrange(consumer.dead_letter_stream)
    assert 100 <= len(rows) < 300, "MAXLEN ~ 100 keeps about the newest 100"
    _, last = rows[-1]
    assert last[b"i"] == b"299" and len(last[b"payload"]) == DEAD_LETTER_FIELD_MAX_BYTES
    assert last[b"dlq_truncated"] == b"payload"
    await consumer.aclose()


@pytest.mark.e2e
async def test_after_a_run_the_message_queue_and_command_streams_hold_no_more_than_the_retention(
        redis_server: RedisServer) -> None:
    config = sim_config(run={"stream_retention_s": 0.0})
    stack = Stack(config, redis_server.url)
    await stack.start()
    try:
        names = stack.names
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
    finally:
        await stack.close()  # a clean stop trims a last time
    streams = [names.mq, names.lb_commands, names.rollouter_commands, names.trainer_commands,
               names.lb_requests, names.lb_results, names.rollouter_results,
               *(names.worker_commands(replica) for replica in config.standalone_ids + config.hybrid_ids)]
    client = connect(redis_server.url)
    try:
        lengths = {stream: await client.xlen(stream) for stream in streams}
    finally:
        await client.aclose()
    assert counts[AccountingField.TRAINED] == 64 and counts[LOST] == 0
    assert lengths == dict.fromkeys(streams, 0)
