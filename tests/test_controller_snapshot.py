"""The controller's crash-safety snapshot: it round-trips, and one saved by another format (the
seed's, before the orchestration moved to core/) is refused with an error that says what to do."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from services.controller.service import Controller
from services.controller.snapshot import HandledEvent, dump_snapshot, load_snapshot
from shared.bus import Bus
from shared.names import Names
from shared.schema import TrainerAction, TrainerPhase, TrainerReply
from shared.streams import connect
from tests.stack import sim_config

KEY = "dynsched:controller:state"
SEED_FORMAT = {"core": {"mode": "standalone_only"},
               "last_event": {"phase": "weights_ready", "global_steps": 4, "status": "done",
                              "reply": {"activated": True}}}
"""A snapshot as the seed's controller wrote it (no format; `last_event` a dict with a status)."""


def test_a_snapshot_round_trips_the_core_state_and_the_handled_event_with_its_reply() -> None:
    reply = TrainerReply(action=TrainerAction.SYNC_DONE, global_steps=4, activated=True)
    event = HandledEvent(phase=TrainerPhase.WEIGHTS_READY, global_steps=4, finished=True,
                         reply={"action": reply.action, "global_steps": 4, "activated": True})
    core_state, back = load_snapshot(dump_snapshot({"mode": "hybrid_active"}, event), key=KEY)
    assert core_state == {"mode": "hybrid_active"}
    assert back == event and back.saved_reply() == reply
    assert load_snapshot(dump_snapshot({}, None), key=KEY) == ({}, None)


@pytest.mark.parametrize(("raw", "complaint"), [
    (msgpack.packb(SEED_FORMAT), "format 1, this controller reads format 2 only"),
    (msgpack.packb({"format": 2, "core": {}, "last_event": {"phase": "weights_ready"}}),
     "unreadable last_event"),
    (b"\xc1 not msgpack", "is not a controller snapshot"),
    (msgpack.packb([1, 2]), "format None"),
], ids=["seed format", "bad last_event", "not msgpack", "not a map"])
def test_a_snapshot_of_another_format_is_refused_naming_the_key_and_the_way_out(raw: bytes,
                                                                               complaint: str) -> None:
    with pytest.raises(ValueError, match="controller:state") as error:
        load_snapshot(raw, key=KEY)
    assert complaint in str(error.value) and "--fresh" in str(error.value)


async def test_a_controller_restarted_on_a_seed_format_snapshot_stops_with_that_error(redis_server) -> None:
    config = sim_config()
    names = Names(config.run.namespace)
    bus = Bus(connect(redis_server.url), names)
    await bus.redis.set(names.controller_state, msgpack.packb(SEED_FORMAT))
    try:
        with pytest.raises(ValueError, match="format 1"):
            await Controller(bus=bus, config=config).run(asyncio.Event())
    finally:
        await bus.redis.aclose()
