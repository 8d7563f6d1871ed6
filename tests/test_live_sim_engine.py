"""The live sim engine (services/rollout_worker/sim_engine.py) runs the planner's replica model on the
wall clock: the same responses finish at the same modelled times, and nothing is lost to interruptions."""

from __future__ import annotations

import asyncio

import pytest

from services.rollout_worker.sim_engine import SimEngine, WallClock
from shared.config import config_from_dict
from shared.schema import FinishReason
from sim.engine import Engine
from sim.model import Replica, Request, Sample, Workload
from sim.scenario import engine_model

TIME_SCALE = 0.02
"""50 modelled s per wall s: the requests below take ~0.2-0.9 wall s."""
PROMPT = 32


def small_config(**sim: float) -> dict:
    return {"run": {"time_scale": TIME_SCALE, "seed": 3},
            "data": {"total_rollout_steps": 8, "n": 4, "max_response_length": 4096, "prompt_length": PROMPT},
            "trainer": {"ppo_mini_batch_size": 2, "num_gpus": 1},
            "rollout": {"sim": {"prefill_s_per_token": 0.0001, "decode_s_per_step": 0.01,
                                "batch_slowdown": 0.05, **sim,
                                "response_length": {"mean": 1200, "std": 400, "min_tokens": 16}}}}


def planner_finish_times(raw: dict, arrivals: list[tuple[float, str]]) -> dict[str, float]:
    """Modelled finish time of each request on the planner's replica (virtual clock)."""
    config = config_from_dict(raw)
    timing, shape = engine_model(config)
    workload = Workload(shape, num_samples=config.data.total_rollout_steps, n=config.data.n,
                        seed=config.run.seed)
    engine = Engine()
    finished: dict[str, float] = {}
    replica = Replica(engine, timing, replica_id="r", hybrid=False,
                      on_finish=lambda rep, req: finished.__setitem__(req.request_id, engine.now_s),
                      on_busy=lambda rep, busy: None)
    for at_s, request_id in arrivals:
        k, j = (int(part) for part in request_id.removeprefix("sample_0_").split("/"))
        req = Request(request_id, Sample(k, 1, at_s), workload.prompt[k], workload.response[k][j])
        engine.at(at_s, replica.submit, req)
    engine.run()
    return finished


async def live_times(engine: SimEngine, arrivals: list[tuple[float, str]]) -> list[tuple[float, str, float]]:
    """(modelled arrival, request id, modelled finish) on the engine's own clock."""
    clock = engine.clock
    assert clock is not None
    seen: list[tuple[float, str, float]] = []

    async def one(at_s: float, request_id: str) -> None:
        await asyncio.sleep(at_s * TIME_SCALE)
        clock.tick()
        arrived_s = clock.now_s
        out = await engine.generate(request_id=request_id, prompt_token_ids=[1] * PROMPT, max_tokens=4096)
        assert out.finish_reason is FinishReason.STOP
        clock.tick()
        seen.append((arrived_s, request_id, clock.now_s))

    await asyncio.gather(*(one(at_s, rid) for at_s, rid in arrivals))
    return seen


@pytest.mark.timeout(60)
async def test_requests_arriving_mid_decode_finish_when_the_planner_says() -> None:
    # Arrivals every 0.7 modelled s interrupt the running decode (the old engine dropped the partial
    # token at every interruption and the oversleep of every tick); given the same arrival times, each
    # response finishes when the planner's replica finishes it, late only by the loop's wake-up delays.
    raw = small_config()
    engine = SimEngine(config=config_from_dict(raw), hybrid=False)
    await engine.start()
    live = await live_times(engine, [(0.7 * i, f"sample_0_{i // 4}/{i % 4}") for i in range(24)])
    planned = planner_finish_times(raw, [(arrived_s, rid) for arrived_s, rid, _ in live])
    late_s = {rid: finished_s - planned[rid] for _, rid, finished_s in live}
    assert min(late_s.values()) >= -0.01, late_s  # never early
    # each response takes 12-44 modelled s; a wake-up costs ~1 ms wall (0.05 modelled s), more when loaded
    assert sum(late_s.values()) / len(late_s) <= 1.0, late_s


@pytest.mark.timeout(30)
async def test_an_aborted_request_keeps_its_partial_tokens_and_its_resume_finishes_the_response() -> None:
    raw = small_config(prefill_s_per_token=0.0)
    config = config_from_dict(raw)
    response = engine_model(config)[1]
    engine = SimEngine(config=config, hybrid=False)
    await engine.start()
    full = engine.workload.response[1][2]
    assert response.kind == "normal" and full > 100
    task = asyncio.create_task(engine.generate(request_id="sample_0_1/2", prompt_token_ids=[1] * PROMPT,
                                               max_tokens=4096))
    await asyncio.sleep(0.5 * full * 0.01 * 1.05 * TIME_SCALE)  # about half the response (batch of one)
    await engine.abort_all()
    partial = await task
    assert partial.finish_reason is FinishReason.ABORT
    assert 0.3 * full < len(partial.token_ids) < 0.7 * full
    await engine.resume()
    done = len(partial.token_ids)
    rest = await engine.generate(request_id="sample_0_1/2", prompt_token_ids=[1] * (PROMPT + done),
                                 max_tokens=4096 - done)
    assert rest.finish_reason is FinishReason.STOP
    assert len(partial.token_ids) + len(rest.token_ids) == full


@pytest.mark.timeout(30)
async def test_a_response_longer_than_max_tokens_stops_at_the_limit() -> None:
    engine = SimEngine(config=config_from_dict(small_config()), hybrid=False)
    await engine.start()
    out = await engine.generate(request_id="sample_0_0/0", prompt_token_ids=[1] * PROMPT, max_tokens=5)
    assert (out.finish_reason, len(out.token_ids)) == (FinishReason.LENGTH, 5)


@pytest.mark.timeout(30)
async def test_a_paused_engine_rejects_new_requests_until_resumed() -> None:
    engine = SimEngine(config=config_from_dict(small_config()), hybrid=False)
    await engine.start()
    await engine.abort_all()
    out = await engine.generate(request_id="sample_0_0/0", prompt_token_ids=[1] * PROMPT, max_tokens=5)
    assert (out.finish_reason, out.token_ids) == (FinishReason.ABORT, [])


async def test_the_wall_clock_fires_callbacks_scheduled_with_after_as_well_as_with_at() -> None:
    clock = WallClock(time_scale=0.001)
    fired: list[str] = []
    done = asyncio.Event()

    def note(name: str) -> None:
        fired.append(name)
        if len(fired) == 2:
            done.set()

    clock.after(5.0, note, "after")
    clock.at(1.0, note, "at")
    await asyncio.wait_for(done.wait(), timeout=5.0)
    assert fired == ["at", "after"]


def test_the_planner_stops_a_modelled_response_at_max_response_length_as_the_engines_do() -> None:
    raw = small_config()
    raw["simulator"] = {"workload": {"prompt_tokens_median": PROMPT, "response_tokens_median_start": 3000,
                                     "response_tokens_median_end": 3000, "response_tokens_max": 65536}}
    raw["data"]["max_response_length"] = 2000
    longest = max(max(row) for row in Workload.from_config(config_from_dict(raw)).response)
    raw["data"]["max_response_length"] = 65536
    uncapped = max(max(row) for row in Workload.from_config(config_from_dict(raw)).response)
    assert (longest, uncapped > 2000) == (2000, True)
