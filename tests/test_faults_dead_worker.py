"""A standalone rollout worker process SIGKILLed mid-run that never returns (real processes, real Redis):
the controller's commands to it end when its heartbeat expires, the controller never crashes,
and the run finishes with every fed sample trained once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
import yaml

from services.launcher import DUPLICATED, LOST
from shared.config import config_to_dict
from shared.names import HEARTBEAT_TTL_S, AccountingField
from shared.names import TrainerStateField as F
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e


async def test_a_standalone_worker_killed_for_good_mid_run_never_stops_the_controller_or_the_run(
        redis_server, tmp_path):
    # A hybrid killed for good while serving can still stall the run (docs/reliability.md, not handled).
    replica_id = "standalone_0"
    config = sim_config(data={"total_rollout_steps": 96})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(config)))
    stack = Stack(config, redis_server.url)
    worker = subprocess.Popen([sys.executable, "-m", "services.rollout_worker", "--config", str(config_path),
                               "--redis-url", redis_server.url, "--log-level", "WARNING",
                               "--replica-id", replica_id])
    await stack.start(without=(replica_id,))
    try:
        redis = stack.buses[0].redis
        beat = stack.names.worker_heartbeat(replica_id)
        # up and serving: its own heartbeat loop (TTL HEARTBEAT_TTL_S) replaced the start-up lease
        while not 0 < await redis.ttl(beat) <= HEARTBEAT_TTL_S \
                or int(await redis.hget(stack.names.trainer_state, F.VERSION) or 0) < 2:
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGKILL)  # and never restarted
        worker.wait()
        await stack.wait_done(timeout_s=90)
        counts = await stack.accounting()
    finally:
        await stack.close()
    assert counts[AccountingField.TRAINED] == 96 and counts[LOST] == 0 and counts[DUPLICATED] == 0

