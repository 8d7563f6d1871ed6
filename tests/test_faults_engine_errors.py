"""An engine that raises on a request (real Redis, sim stack; the engine's `generate` made to fail):
the worker answers `error`, the rollouter retries the request, and a request that always fails ends its
trajectory truncated after MAX_ENGINE_ERRORS attempts. Either way the run finishes with every fed
sample trained once; before, the request stayed unanswered and the run never finished."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from core.sample_progress import MAX_ENGINE_ERRORS
from services.launcher import DUPLICATED, LOST
from services.rollout_worker.engine import EngineOutput
from services.rollout_worker.sim_engine import SimEngine
from shared.names import AccountingField
from shared.schema import FinishReason, Sample
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e
Generate = Callable[..., Awaitable[EngineOutput]]


def failing(original: Generate, fails: Callable[[str, int], bool]) -> Generate:
    """`SimEngine.generate`, raising for the calls `fails(request_id, call_number)` picks."""
    calls = {"n": 0}

    async def generate(self: SimEngine, **kwargs: Any) -> EngineOutput:
        calls["n"] += 1
        if fails(kwargs["request_id"], calls["n"]):
            raise RuntimeError("CUDA out of memory (injected)")
        return await original(self, **kwargs)
    return generate


async def run(stack: Stack) -> tuple[dict[str, int], list[Sample]]:
    """Start, wait for the end; the sample counts and the MessageQueue's samples."""
    await stack.start()
    try:
        await stack.wait_done(timeout_s=60)
        return await stack.accounting(), await stack.samples()
    finally:
        await stack.close()


async def test_a_request_the_engine_fails_once_is_retried_and_the_run_finishes(redis_server, monkeypatch):
    monkeypatch.setattr(SimEngine, "generate", failing(SimEngine.generate, lambda _, n: n == 5))
    counts, _ = await run(Stack(sim_config(), redis_server.url))
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0


async def test_a_request_the_engine_always_fails_ends_truncated_and_the_run_still_finishes(
        redis_server, monkeypatch):
    doomed = "sample_0_3/1"
    monkeypatch.setattr(SimEngine, "generate", failing(SimEngine.generate, lambda rid, _: rid == doomed))
    counts, samples = await run(Stack(sim_config(), redis_server.url))
    assert counts[AccountingField.FED] == counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
    given_up = [t for s in samples for t in s.trajectories if t.request_id == doomed]
    assert len(given_up) == 1 and given_up[0].finish_reason is FinishReason.ERROR
    assert given_up[0].num_attempts == MAX_ENGINE_ERRORS and given_up[0].response_token_ids == []
