"""The admin API as an operator sees it during and after a run: forced switches said the same way in
the POST reply and in /status, a finished run that says so and refuses switches, and the dashboard's
JSON (resource-time rows, mq_size and utilization series) while the stack runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from services.controller.admin import PrometheusExporter, build_app
from shared.names import RunStatus, TrainerStateField
from tests.conftest import RedisServer
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    """A running sim stack (controller in process) and a client on its admin app."""
    stack = Stack(sim_config(data={"total_rollout_steps": 96}), redis_server.url)
    await stack.start()
    assert stack.controller is not None
    transport = httpx.ASGITransport(app=build_app(stack.controller, PrometheusExporter(), token="t"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://admin",
                                     headers={"Authorization": "Bearer t"}) as client:
            yield stack, client
    finally:
        await stack.close()


async def test_a_forced_deactivate_reads_the_same_in_the_reply_and_in_status(
        admin: tuple[Stack, httpx.AsyncClient]) -> None:
    _, client = admin
    reply = await client.post("/deactivate")
    assert reply.status_code == 202 and reply.json()["pending_force"] == "deactivate"
    status = (await client.get("/status")).json()
    assert status["pending_force"] in ("deactivate", None)  # None once the next micro-step applied it
    assert status["finished"] is False and status["run_status"] == RunStatus.RUNNING


async def test_a_finished_run_says_so_and_refuses_forced_switches_with_409(
        admin: tuple[Stack, httpx.AsyncClient]) -> None:
    stack, client = admin
    await stack.wait_done(timeout_s=90)
    status = (await client.get("/status")).json()
    assert status["finished"] is True and status["run_status"] == RunStatus.DONE
    for action in ("activate", "deactivate"):
        refused = await client.post(f"/{action}")
        assert refused.status_code == 409 and "finished" in refused.json()["detail"]


async def test_the_dashboard_json_shows_every_replica_and_the_trainer_while_the_run_progresses(
        admin: tuple[Stack, httpx.AsyncClient]) -> None:
    stack, client = admin
    redis = stack.buses[0].redis
    while int(await redis.hget(stack.names.trainer_state, TrainerStateField.VERSION) or 0) < 2:
        await asyncio.sleep(0.05)
    timeline = (await client.get("/api/timeline", params={"window_s": 60})).json()
    assert timeline["order"] == ["standalone_0", "standalone_1", "hybrid_0", "hybrid_1", "trainer"]
    categories = {c for rows in timeline["rows"].values() for _, _, c in rows}
    assert {"rollout", "train"} <= categories
    assert all(-60 <= a <= b <= 0 for rows in timeline["rows"].values() for a, b, _ in rows)
    await stack.wait_done(timeout_s=90)
    series = (await client.get("/api/series")).json()
    assert series["mq"] and all(t <= 0 for t, _ in series["mq"])
    assert series["cycles"] and "dynamic_resource/resource_utilization" in series["cycles"][-1]
    page = await client.get("/dashboard")
    assert page.status_code == 200 and "/dashboard/dashboard.js" in page.text
    assert (await client.get("/dashboard/dashboard.js")).status_code == 200
    assert (await client.get("/dashboard/secrets.txt")).status_code == 404
