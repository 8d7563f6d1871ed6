"""The trainer process SIGKILLed during a weight sync (real processes, real Redis): the restarted
trainer finishes that sync instead of training the step again, and the run finishes with every fed
sample trained exactly once (checked per sample id)."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest
import yaml

from services.launcher import DUPLICATED, LOST
from shared.bus import text
from shared.config import config_to_dict
from shared.names import AccountingField, SampleState
from shared.names import TrainerStateField as F
from shared.schema import TrainerEvent, TrainerPhase, decode
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e
SAMPLES = 96


def spawn_trainer(config_path: Any, redis_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.trainer", "--config", str(config_path),
                             "--redis-url", redis_url, "--log-level", "WARNING"])


async def wait_for_weights_ready(stack: Stack, min_version: int) -> TrainerEvent:
    """Block on the trainer's events until it announces a sync of `min_version` or later."""
    redis, last = stack.buses[0].redis, "0-0"
    while True:
        reply: Any = await redis.xread({stack.names.trainer_events: last}, block=2000)
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last = text(entry_id)
                event = decode(fields)
                if (isinstance(event, TrainerEvent) and event.phase is TrainerPhase.WEIGHTS_READY
                        and event.version >= min_version):
                    return event


async def test_a_trainer_killed_during_a_weight_sync_resumes_the_sync_and_trains_nothing_twice(
        redis_server, tmp_path):
    config = sim_config(data={"total_rollout_steps": SAMPLES})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(config)))
    stack = Stack(config, redis_server.url)
    trainer = spawn_trainer(config_path, redis_server.url)
    await stack.start(without=("trainer",))
    try:
        redis = stack.buses[0].redis
        await wait_for_weights_ready(stack, min_version=3)
        trainer.send_signal(signal.SIGKILL)  # mid-sync: the controller has not answered yet
        trainer.wait()
        at_kill = {text(k): text(v) for k, v in (await redis.hgetall(stack.names.trainer_state)).items()}
        trainer = spawn_trainer(config_path, redis_server.url)
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
        fed = {s.sample_id for s in await stack.samples()}
        states = {text(k): text(v) for k, v in (await redis.hgetall(stack.names.sample_states)).items()}
        dead = await redis.xlen(stack.names.dead_letters)
    finally:
        trainer.terminate()
        trainer.wait(timeout=15)
        await stack.close()
    assert at_kill[F.SYNC_PENDING] == "1", at_kill  # killed between the step's commit and its sync's end
    assert len(fed) == SAMPLES and set(states) == fed
    assert all(state == SampleState.TRAINED for state in states.values())
    assert counts[AccountingField.TRAINED] == SAMPLES and counts[LOST] == 0 and counts[DUPLICATED] == 0
    assert dead == 0

