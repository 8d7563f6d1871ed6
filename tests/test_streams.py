"""shared/streams.py against a real redis-server (fixture in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.exceptions import DataError

from shared import streams
from shared.streams import StreamConsumer, connect, ensure_group, group_lag, group_pending, xadd_many
from tests.conftest import RedisServer

STREAM = "t:mq"
GROUP = "trainer"


def make_consumer(r: aredis.Redis, name: str, **kwargs: object) -> StreamConsumer:
    return StreamConsumer(r, stream=STREAM, group=GROUP, consumer=name, **kwargs)  # type: ignore[arg-type]


async def produce(r: aredis.Redis, n: int, start: int = 0) -> list[bytes]:
    return await xadd_many(r, STREAM, ({b"i": str(i)} for i in range(start, start + n)), chunk_size=7)


def values(entries: list[streams.StreamEntry]) -> list[int]:
    return [int(e.fields[b"i"]) for e in entries]


def test_block_ms_is_well_below_the_socket_timeout() -> None:
    assert streams.BLOCK_MS * 2 < streams.SOCKET_TIMEOUT_S * 1000
    with pytest.raises(ValueError):
        connect("redis://127.0.0.1:1/0", socket_timeout_s=1.0)


async def test_ensure_group_is_idempotent_and_sees_entries_written_before_it(
        redis_client: aredis.Redis) -> None:
    await produce(redis_client, 3)
    assert await ensure_group(redis_client, STREAM, GROUP) is True
    assert await ensure_group(redis_client, STREAM, GROUP) is False
    c = make_consumer(redis_client, "c0")
    await c.start()
    assert values(await c.read(10, block_ms=0)) == [0, 1, 2]
    await c.aclose()


async def test_xadd_many_keeps_order_across_pipeline_chunks(redis_client: aredis.Redis) -> None:
    ids = await produce(redis_client, 20)
    assert len(ids) == 20
    assert ids == sorted(ids, key=lambda i: tuple(int(x) for x in i.split(b"-")))
    rows: Any = await redis_client.xrange(STREAM)
    assert [int(f[b"i"]) for _, f in rows] == list(range(20))


async def test_a_restarted_consumer_replays_its_own_pending_entries_first(redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "trainer-0")
    await c.start()
    await produce(redis_client, 5)
    first = await c.read(3, block_ms=0)
    await c.ack([first[0].entry_id])
    await c.aclose()  # crash: entries 1 and 2 stay pending under "trainer-0"
    await produce(redis_client, 2, start=5)

    restarted = make_consumer(redis_client, "trainer-0")
    await restarted.start()
    replayed = await restarted.read(10, block_ms=0) + await restarted.read(10, block_ms=0)
    assert values(replayed) == [1, 2]  # one at a time: delivery counts are judged per entry
    assert [e.deliveries for e in replayed] == [2, 2]
    assert values(await restarted.read(10, block_ms=0)) == [3, 4, 5, 6]
    await restarted.aclose()


async def test_acked_entries_are_not_replayed_and_lag_counts_untaken_samples(
        redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "c0")
    await c.start()
    await produce(redis_client, 10)
    assert await group_lag(redis_client, STREAM, GROUP) == 10
    got = await c.read(4, block_ms=0)
    assert await group_lag(redis_client, STREAM, GROUP) == 6
    assert await group_pending(redis_client, STREAM, GROUP) == 4
    assert await c.ack(e.entry_id for e in got) == 4
    assert await group_pending(redis_client, STREAM, GROUP) == 0
    c.rewind()
    assert values(await c.read(10, block_ms=0)) == [4, 5, 6, 7, 8, 9]
    await c.aclose()


async def test_publish_and_ack_sends_every_answer_and_acks_every_entry_in_one_transaction(
        redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "c0")
    await c.start()
    await produce(redis_client, 5)
    got = await c.read(5, block_ms=0)
    await c.publish_and_ack([e.entry_id for e in got[:3]], "t:answers", [{b"a": i} for i in range(3)])
    assert [f[b"a"] for _, f in await redis_client.xrange("t:answers")] == [b"0", b"1", b"2"]
    assert await group_pending(redis_client, STREAM, GROUP) == 2
    with pytest.raises(DataError):  # one answer Redis cannot take: nothing sent, nothing acked
        await c.publish_and_ack([got[3].entry_id, got[4].entry_id], "t:answers",
                                [{b"a": 3}, {b"a": object()}])  # type: ignore[dict-item]
    assert await redis_client.xlen("t:answers") == 3
    assert await group_pending(redis_client, STREAM, GROUP) == 2
    await c.aclose()


async def test_group_lag_falls_back_when_redis_cannot_compute_lag(redis_client: aredis.Redis) -> None:
    assert await group_lag(redis_client, "missing", GROUP) == 0
    ids = await produce(redis_client, 6)
    assert await group_lag(redis_client, STREAM, GROUP) == 6  # no group yet: everything is untaken
    c = make_consumer(redis_client, "c0")
    await c.start()
    await c.read(2, block_ms=0)
    await redis_client.xdel(STREAM, ids[4])  # a deletion past the read point makes Redis report lag = nil
    info = [g for g in await redis_client.xinfo_groups(STREAM) if g["name"] == GROUP.encode()][0]
    assert info["lag"] is None
    assert await group_lag(redis_client, STREAM, GROUP) == 3
    await c.aclose()


async def test_entries_of_a_consumer_whose_lease_expired_are_reclaimed_but_a_live_consumers_are_not(
    redis_client: aredis.Redis,
) -> None:
    dying = make_consumer(redis_client, "dying", lease_ttl_s=0.2)
    live = make_consumer(redis_client, "live", lease_ttl_s=30)
    rescuer = make_consumer(redis_client, "rescuer", lease_ttl_s=30)
    for c in (dying, live, rescuer):
        await c.start()
    await produce(redis_client, 4)
    assert values(await dying.read(2, block_ms=0)) == [0, 1]
    assert values(await live.read(2, block_ms=0)) == [2, 3]

    assert await rescuer.reclaim_dead() == 0  # both leases still valid
    await asyncio.sleep(0.35)  # "dying" stops renewing; its lease runs out
    assert await rescuer.dead_consumers() == ["dying"]
    assert await rescuer.reclaim_dead() == 2
    pending = await redis_client.xpending_range(STREAM, GROUP, min="-", max="+", count=10)
    assert {p["consumer"]: 0 for p in pending} == {b"rescuer": 0, b"live": 0}
    reclaimed = await rescuer.read(10, block_ms=0) + await rescuer.read(10, block_ms=0)
    assert values(reclaimed) == [0, 1]  # handed out one per read
    assert [e.deliveries for e in reclaimed] == [2, 2]
    assert await rescuer.reclaim_dead() == 0  # nothing left to take, live's entries untouched
    for c in (dying, live, rescuer):
        await c.aclose()


async def test_a_poison_entry_goes_to_the_dead_letter_stream_after_max_deliveries(
        redis_client: aredis.Redis) -> None:
    await produce(redis_client, 1)
    deliveries: list[int] = []
    for _ in range(3):  # the consumer crashes on the entry every time (never acks)
        c = make_consumer(redis_client, "worker-0", max_deliveries=3)
        await c.start()
        deliveries.extend(e.deliveries for e in await c.read(10, block_ms=0))
        await c.aclose()
    assert deliveries == [1, 2, 3]

    c = make_consumer(redis_client, "worker-0", max_deliveries=3)
    await c.start()
    assert await c.read(10, block_ms=0) == []
    assert c.dead_lettered == 1
    assert await group_pending(redis_client, STREAM, GROUP) == 0
    rows: Any = await redis_client.xrange(STREAM + streams.DEAD_LETTER_SUFFIX)
    [(_, dead)] = rows
    assert dead[b"i"] == b"0"
    assert dead[b"dlq_reason"] == b"max_deliveries"
    assert dead[b"dlq_stream"] == STREAM.encode()
    assert dead[b"dlq_group"] == GROUP.encode()
    assert dead[b"dlq_deliveries"] == b"4"
    await c.aclose()


async def test_a_consumer_that_crashes_on_one_entry_of_a_batch_dead_letters_that_entry_alone(
        redis_client: aredis.Redis) -> None:
    await produce(redis_client, 5)
    c = make_consumer(redis_client, "worker-0")
    await c.start()
    assert values(await c.read(10, block_ms=0)) == [0, 1, 2, 3, 4]
    await c.aclose()  # crash with the whole batch in hand
    done: list[int] = []
    for _ in range(streams.DEFAULT_MAX_DELIVERIES + 2):  # restarts, each crashing on entry 2
        c = make_consumer(redis_client, "worker-0")
        await c.start()
        while entries := await c.read(10, block_ms=0):
            if values(entries) == [2]:
                break  # crash: never acked
            done.extend(values(entries))
            await c.ack(e.entry_id for e in entries)
        await c.aclose()
    assert sorted(done) == [0, 1, 3, 4]
    rows: Any = await redis_client.xrange(STREAM + streams.DEAD_LETTER_SUFFIX)
    assert [f[b"i"] for _, f in rows] == [b"2"]
    assert await group_pending(redis_client, STREAM, GROUP) == 0


async def test_reclaimed_entries_are_charged_a_delivery_each_when_handed_out_not_as_a_batch(
        redis_client: aredis.Redis) -> None:
    # A chain of consumers, each taking over the previous one's entries and dying on entry 2: only
    # entry 2 is charged each time; 3 and 4, claimed again and again but never handed out, are not.
    await produce(redis_client, 5)
    dying = make_consumer(redis_client, "c0", lease_ttl_s=0.1)
    await dying.start()
    assert values(await dying.read(10, block_ms=0)) == [0, 1, 2, 3, 4]  # dies with the batch
    await dying.aclose()
    done: list[int] = []
    for life in range(1, streams.DEFAULT_MAX_DELIVERIES + 3):
        await asyncio.sleep(0.15)  # the previous consumer's lease runs out
        rescuer = make_consumer(redis_client, f"c{life}", lease_ttl_s=0.1)
        await rescuer.start()
        await rescuer.reclaim_dead()
        while entries := await rescuer.read(10, block_ms=0):
            if values(entries) == [2]:
                break  # crash: never acked
            done.extend(values(entries))
            await rescuer.ack(e.entry_id for e in entries)
        await rescuer.aclose()
    assert sorted(done) == [0, 1, 3, 4]
    rows: Any = await redis_client.xrange(STREAM + streams.DEAD_LETTER_SUFFIX)
    assert [f[b"i"] for _, f in rows] == [b"2"]
    assert await group_pending(redis_client, STREAM, GROUP) == 0


async def test_a_reclaimed_poison_entry_is_dead_lettered_not_returned(redis_client: aredis.Redis) -> None:
    await produce(redis_client, 1)
    dying = make_consumer(redis_client, "dying", lease_ttl_s=0.1, max_deliveries=1)
    rescuer = make_consumer(redis_client, "rescuer", max_deliveries=1, dead_letter_stream="t:dead")
    await dying.start()
    await rescuer.start()
    await dying.read(1, block_ms=0)
    await asyncio.sleep(0.2)
    assert await rescuer.reclaim_dead() == 1
    assert await rescuer.read(10, block_ms=0) == []
    assert await redis_client.xlen("t:dead") == 1
    assert await group_pending(redis_client, STREAM, GROUP) == 0
    await dying.aclose()
    await rescuer.aclose()


async def test_an_entry_deleted_while_pending_is_acked_and_skipped_on_replay(
        redis_client: aredis.Redis) -> None:
    ids = await produce(redis_client, 2)
    c = make_consumer(redis_client, "c0")
    await c.start()
    await c.read(2, block_ms=0)
    await c.aclose()
    await redis_client.xdel(STREAM, ids[0])
    restarted = make_consumer(redis_client, "c0")
    await restarted.start()
    assert values(await restarted.read(10, block_ms=0)) == [1]
    assert restarted.deleted_pending == 1
    await restarted.aclose()


async def test_a_blocking_read_returns_an_entry_written_while_it_waits(redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "c0")
    await c.start()
    reader = asyncio.create_task(c.read(10, block_ms=1500))
    await asyncio.sleep(0.1)
    await produce(redis_client, 1)
    assert values(await asyncio.wait_for(reader, 2)) == [0]
    assert await c.read(10, block_ms=50) == []
    await c.aclose()


async def test_a_stream_deleted_while_a_read_blocks_on_it_is_read_on_after_its_group_is_recreated(
        redis_client: aredis.Redis) -> None:
    """Redis ends such a read with `UNBLOCKED the stream key no longer exists`: each service's read loop
    raised it and its process exited (a `DEL` of any command stream cost a restart)."""
    c = make_consumer(redis_client, "c0")
    await c.start()
    await produce(redis_client, 1)
    assert values(await c.read(10, block_ms=50)) == [0]
    reader = asyncio.create_task(c.read(10, block_ms=1500))
    await asyncio.sleep(0.1)
    await redis_client.delete(STREAM)
    await asyncio.sleep(0.1)
    await produce(redis_client, 1, start=1)
    assert values(await asyncio.wait_for(reader, 3)) == [1]
    await c.aclose()


async def test_block_ms_near_the_socket_timeout_is_refused(redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "c0")
    with pytest.raises(ValueError):
        await c.read(1, block_ms=int(streams.SOCKET_TIMEOUT_S * 1000))
    await c.aclose()


async def test_blocking_read_survives_a_redis_restart(redis_server: RedisServer,
                                                      redis_client: aredis.Redis) -> None:
    c = make_consumer(redis_client, "c0")
    await c.start()
    reader = asyncio.create_task(c.read(10, block_ms=1000))
    await asyncio.sleep(0.1)
    redis_server.restart()  # data lost: stream and group are gone
    await asyncio.sleep(0.1)
    first = await asyncio.wait_for(reader, 10)
    assert first == []
    await produce(redis_client, 2)
    got = await c.read(10, block_ms=500)
    assert values(got) == [0, 1]
    await c.aclose()


async def test_bad_consumer_arguments_are_value_errors(redis_client: aredis.Redis) -> None:
    with pytest.raises(ValueError):
        make_consumer(redis_client, "")
    with pytest.raises(ValueError):
        make_consumer(redis_client, "c", max_deliveries=0)
    with pytest.raises(ValueError):
        make_consumer(redis_client, "c", lease_ttl_s=0)


async def test_a_read_in_a_task_whose_cancel_was_swallowed_raises_the_cancel_again(redis_client) -> None:
    await ensure_group(redis_client, "t:swallow", "g")
    consumer = StreamConsumer(redis_client, stream="t:swallow", group="g", consumer="c")

    async def loop() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed, as redis-py can (redis-py#2028)
            await asyncio.sleep(10)
        await consumer.read(1, block_ms=0)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await consumer.aclose()
