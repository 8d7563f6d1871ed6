"""The engine interface a rollout-worker drives (docs/contracts.md).

Backends: `sim_engine.SimEngine` (timing model of a GPU replica) and
`vllm_engine.VllmEngine` (real vLLM). The worker never knows which one it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.schema import FinishReason, PushStep


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOutput:
    """What one generate() call produced."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    """STOP, LENGTH, or ABORT (partial tokens; the engine was paused)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Optional, by name: "decode_s" (seconds from the first decoded token to the last), "decode_tokens"
    (the tokens of that time), "mean_inflight" (requests the engine held on average meanwhile, this one
    included) and "mean_context" (the context tokens they held): what the controller fits the engine's
    step against its load from (core/measure.py)."""


class Engine(Protocol):
    async def start(self) -> None: ...

    async def generate(self, *, request_id: str, prompt_token_ids: list[int],
                       max_tokens: int) -> EngineOutput: ...

    async def abort_all(self) -> None: ...

    async def resume(self) -> None: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def load_weights(self, *, version: int, path: str | None) -> None: ...

    async def transfer(self, step: PushStep, info: dict[str, Any], *, version: int) -> None:
        """One step (init, start, update, finish) of a weight push the trainer drives."""

    async def close(self) -> None: ...
