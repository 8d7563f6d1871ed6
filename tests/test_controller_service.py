"""The controller service's event handling against a real Redis (no other services running)."""

from __future__ import annotations

from services.controller.service import CONSUMER, Controller
from shared.bus import Bus
from shared.names import CONTROLLER_GROUP, Names
from shared.schema import TrainerEvent
from shared.streams import connect
from tests.stack import sim_config


async def test_a_trainer_event_arriving_while_a_handler_waits_for_another_is_handled_next_not_dropped(
        redis_server):
    """A restarted trainer's micro_step_start can arrive while the controller waits for the
    release ack (or a push report) of the sync in progress; it must come out of the main loop
    next, and stay unacked until then (a controller crash replays it)."""
    config = sim_config()
    bus = Bus(connect(redis_server.url), Names(config.run.namespace))
    controller = Controller(bus=bus, config=config)
    events = await bus.subscribe(bus.names.trainer_events, CONTROLLER_GROUP, CONSUMER)
    try:
        await bus.publish(bus.names.trainer_events, TrainerEvent(phase="micro_step_start", global_steps=5, version=2))
        await bus.publish(bus.names.trainer_events, TrainerEvent(phase="gpus_released_ack", global_steps=4, version=2))
        awaited = await controller._await_trainer(events, lambda m: m.phase == "gpus_released_ack")
        assert awaited.global_steps == 4
        pending = await bus.redis.xpending(bus.names.trainer_events, CONTROLLER_GROUP)
        assert pending["pending"] == 1
        [(_, kept)] = await controller._next_events(events)
        assert isinstance(kept, TrainerEvent) and (kept.phase, kept.global_steps) == ("micro_step_start", 5)
    finally:
        await events.close()
        await bus.redis.aclose()
