"""Timing model of one GPU rollout replica, behind the Engine interface.

Where it sits: the `sim` backend of a rollout-worker, so the whole control
plane (controller, load balancer, rollouter, trainer) runs at cluster scale
on one machine. Every modelled second is `time_scale` wall seconds.

Model: a request first pays prefill (`prefill_s_per_token` x prompt length,
so a resumed partial rollout pays to re-prefill its partial tokens, as the
real system recomputes KV). Then all running requests decode together; one
decode step emits one token per request and takes
`decode_s_per_step * (1 + batch_slowdown * running)`. A request's total
response length is drawn once from its request id (normal(mean, std), mean
growing by `drift_per_version` per weight version), so a resumed request
finishes the same response. Abort returns the tokens made so far.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from services.rollout_worker.engine import EngineOutput
from shared.config import SimEngineConfig
from shared.runtime import sleep_unless
from shared.schema import FinishReason, PushStep

MAX_TOKENS_PER_TICK = 32
"""Upper bound on tokens advanced between two looks at the batch, so arrivals join promptly."""
VOCAB_SIZE = 1000


@dataclass
class _Running:
    remaining: int
    hit_length_limit: bool
    rng: random.Random
    token_ids: list[int] = field(default_factory=list)
    done: asyncio.Future[FinishReason] | None = None


class SimEngine:
    """A simulated replica. Not thread-safe; one per event loop."""

    def __init__(self, *, config: SimEngineConfig, time_scale: float, prompt_length: int, seed: int) -> None:
        self.config = config
        self.time_scale = time_scale
        self.prompt_length = prompt_length
        self.seed = seed
        self.version = 0
        self.paused = False
        self.sleep_mode = "simulated"
        self._running: dict[str, _Running] = {}
        self._changed = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._decode_loop())

    async def close(self) -> None:
        await self.abort_all()
        if self._loop_task:
            self._loop_task.cancel()

    async def generate(self, *, request_id: str, prompt_token_ids: list[int],
                       max_tokens: int) -> EngineOutput:
        if self.paused:
            return EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ABORT)
        await asyncio.sleep(self.config.prefill_s_per_token * len(prompt_token_ids) * self.time_scale)
        if self.paused:
            return EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ABORT)
        target = self._target_length(request_id)
        generated_so_far = max(0, len(prompt_token_ids) - self.prompt_length)
        remaining = max(1, target - generated_so_far)
        rng = random.Random(zlib.crc32(f"{request_id}/{generated_so_far}".encode()) ^ self.seed)
        running = _Running(remaining=min(remaining, max_tokens), hit_length_limit=remaining > max_tokens,
                           rng=rng)
        running.done = asyncio.get_running_loop().create_future()
        self._running[request_id + f"#{id(running)}"] = running
        self._changed.set()
        finish_reason = await running.done
        logprobs = [-0.1 - rng.random() for _ in running.token_ids]
        return EngineOutput(token_ids=running.token_ids, logprobs=logprobs, finish_reason=finish_reason)

    async def abort_all(self) -> None:
        self.paused = True
        self._changed.set()
        await asyncio.sleep(0)

    async def resume(self) -> None:
        self.paused = False

    async def sleep(self) -> None:
        await self.abort_all()
        await asyncio.sleep(self.config.sleep_s * self.time_scale)

    async def wake(self) -> None:
        await asyncio.sleep(self.config.wake_s * self.time_scale)

    async def load_weights(self, *, version: int, path: str | None) -> None:
        await asyncio.sleep(self.config.weight_sync_s * self.time_scale)
        self.version = version

    async def transfer(self, step: PushStep, info: dict[str, Any], *, version: int) -> None:
        raise ValueError("the sim engine has no push weight transport (config validation forbids it)")

    def _target_length(self, request_id: str) -> int:
        lengths = self.config.response_length
        rng = random.Random(zlib.crc32(request_id.encode()) ^ self.seed)
        mean = lengths.mean * (1.0 + lengths.drift_per_version * self.version)
        return max(lengths.min_tokens, int(rng.gauss(mean, lengths.std)))

    def _step_time_s(self) -> float:
        slowdown = 1.0 + self.config.batch_slowdown * len(self._running)
        return self.config.decode_s_per_step * slowdown * self.time_scale

    async def _decode_loop(self) -> None:
        """1. wait for work; 2. advance every running request by the tokens that fit in the
        time until the next finish (or until interrupted); 3. finish or abort requests."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._running:
                self._changed.clear()
                await self._changed.wait()
                continue
            if self.paused:
                self._finish_all(FinishReason.ABORT)
                continue
            step_s = self._step_time_s()
            tokens_to_next = min(MAX_TOKENS_PER_TICK, min(r.remaining for r in self._running.values()))
            self._changed.clear()
            started = loop.time()
            await sleep_unless(self._changed, tokens_to_next * step_s)
            elapsed = loop.time() - started
            advanced = tokens_to_next if step_s <= 0 else min(tokens_to_next, int(elapsed / step_s + 1e-9))
            self._advance(advanced)

    def _advance(self, num_tokens: int) -> None:
        for key, running in list(self._running.items()):
            running.token_ids.extend(running.rng.randrange(3, VOCAB_SIZE) for _ in range(num_tokens))
            running.remaining -= num_tokens
            if running.remaining <= 0:
                self._finish(key, FinishReason.LENGTH if running.hit_length_limit else FinishReason.STOP)

    def _finish_all(self, finish_reason: FinishReason) -> None:
        for key in list(self._running):
            self._finish(key, finish_reason)

    def _finish(self, key: str, finish_reason: FinishReason) -> None:
        running = self._running.pop(key)
        if running.done is not None and not running.done.done():
            running.done.set_result(finish_reason)
