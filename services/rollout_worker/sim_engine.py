"""Timing model of one GPU rollout replica, behind the Engine interface.

Where it sits: the `sim` backend of a rollout-worker, so the whole control
plane (controller, load balancer, rollouter, trainer) runs at cluster scale
on one machine. Every modelled second is `time_scale` wall seconds.

Model: the planner's own replica, not a copy. `sim.model.Replica` (continuous
batching: FIFO prefill, lock-step decode whose step grows with the batch and
the context, the running cap, the KV capacity, abort keeping partial tokens)
with the timing and token lengths the planner derives from the same config
(`sim.scenario.engine_model`), driven here by the asyncio loop's clock instead
of the simulator's event heap (`WallClock`). Request `sample_0_K/j` decodes
the planner's response j of sample K (`sim.model.Workload`, drawn from
`run.seed`), so a resumed request finishes the same response, and a live run
differs from the planner only by what the services add (Redis round trips,
polls, process scheduling): what `bench/sim_to_live.py` measures.

Progress is integrated from the clock, never counted in ticks: a decode
interrupted by an arrival keeps its fractional token, and a timer that fires
late loses nothing (the request finishes late, with the tokens it had).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import numpy as np

from core.sample_lifecycle import sample_index
from services.rollout_worker.engine import EngineOutput
from shared.config import Config
from shared.schema import FinishReason, PushStep
from sim.engine import Callback
from sim.engine import Engine as EventEngine
from sim.model import Replica, Request, Sample, Workload
from sim.scenario import engine_model

VOCAB_SIZE = 1000


class WallClock(EventEngine):
    """The simulator's scheduling interface (``now_s``, ``at``, ``after``) on the asyncio loop's clock:
    modelled time = (loop time - start) / time_scale. ``now_s`` holds still while one callback
    runs, as on the virtual clock; ``tick`` moves it to the present before the engine acts."""

    def __init__(self, time_scale: float) -> None:
        super().__init__()
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()

    def tick(self) -> None:
        self.now_s = max(self.now_s, (self._loop.time() - self._t0) / self.time_scale)

    def at(self, time_s: float, callback: Callback, *args: Any) -> None:
        self._loop.call_at(self._t0 + time_s * self.time_scale, self._fire, callback, args)

    def _fire(self, callback: Callback, args: tuple[Any, ...]) -> None:
        self.tick()
        callback(*args)


class SimEngine:
    """A simulated replica. Not thread-safe; one per event loop."""

    def __init__(self, *, config: Config, hybrid: bool) -> None:
        self.timing, _ = engine_model(config)
        self.workload = Workload.from_config(config)
        self.sleep_costs = config.rollout.sim
        self.time_scale = config.run.time_scale
        self.prompt_length = config.data.prompt_length
        self.seed = config.run.seed
        self.hybrid = hybrid
        self.paused = False
        self.sleep_mode = "simulated"
        self.clock: WallClock | None = None
        self._replica: Replica | None = None
        self._waiting: dict[Request, asyncio.Future[FinishReason]] = {}
        self._serial = 0

    @property
    def version(self) -> int:
        return self._replica.version if self._replica else 0

    async def start(self) -> None:
        self.clock = WallClock(self.time_scale)
        self._replica = Replica(self.clock, self.timing, replica_id="sim", hybrid=self.hybrid,
                                on_finish=self._on_finish, on_busy=lambda replica, busy: None)
        self._replica.wake()  # the worker owns sleep and wake; the replica only times them

    async def close(self) -> None:
        await self.abort_all()

    async def generate(self, *, request_id: str, prompt_token_ids: list[int],
                       max_tokens: int) -> EngineOutput:
        assert self.clock is not None and self._replica is not None, "generate before start"
        if self.paused:
            return EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ABORT)
        k, j, known = self._indices(request_id)
        # the sim prompts of sample k are the planner's prompt[k] tokens long (services/rollouter/prompts.py)
        prompt_tokens = self.workload.prompt[k] if known else self.prompt_length
        generated_so_far = max(0, len(prompt_token_ids) - prompt_tokens)
        response = self.workload.response[k][j]
        target = min(max(response, generated_so_far + 1), generated_so_far + max_tokens)
        self._serial += 1
        req = Request(f"{request_id}#{self._serial}", Sample(k, 1, self.clock.now_s),
                      self.workload.prompt[k], target)
        req.generated = float(generated_so_far)
        done = self._waiting[req] = asyncio.get_running_loop().create_future()
        self.clock.tick()
        self._replica.submit(req)
        finish_reason = await done
        if finish_reason is not FinishReason.ABORT and response > target:
            finish_reason = FinishReason.LENGTH
        num_tokens = max(0, int(req.generated + 1e-6) - generated_so_far)
        timings = {} if finish_reason is FinishReason.ABORT else {  # the replica's report (sim/model.py)
            "decode_s": req.decode_s * self.clock.time_scale, "decode_tokens": req.decode_tokens,
            "mean_inflight": req.mean_inflight, "mean_context": req.mean_context}
        # numpy, not a Python loop: thousands of tokens per response are CPU the services compete for
        rng = np.random.default_rng(zlib.crc32(f"{request_id}/{generated_so_far}".encode()) ^ self.seed)
        token_ids = rng.integers(3, VOCAB_SIZE, num_tokens).tolist()
        logprobs = (-0.1 - rng.random(num_tokens)).tolist()
        return EngineOutput(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                            timings=timings)

    def _indices(self, request_id: str) -> tuple[int, int, bool]:
        """(sample index, trajectory, True) of `sample_0_K/j`; any other id maps onto a drawn pair
        (False)."""
        sample_id, _, trajectory = request_id.rpartition("/")
        try:
            k, j = sample_index(sample_id), int(trajectory)
        except ValueError:
            k = j = -1
        num_samples, n = len(self.workload.response), len(self.workload.response[0])
        if not (0 <= k < num_samples and 0 <= j < n):
            draw = zlib.crc32(request_id.encode())
            return draw % num_samples, (draw // num_samples) % n, False
        return k, j, True

    def _on_finish(self, replica: Replica, req: Request) -> None:
        self._resolve(req, FinishReason.STOP)

    def _resolve(self, req: Request, finish_reason: FinishReason) -> None:
        done = self._waiting.pop(req, None)
        if done is not None and not done.done():
            done.set_result(finish_reason)

    async def abort_all(self) -> None:
        self.paused = True
        if self.clock is not None and self._replica is not None:
            self.clock.tick()
            for req in self._replica.abort_all():
                self._resolve(req, FinishReason.ABORT)
        await asyncio.sleep(0)

    async def resume(self) -> None:
        self.paused = False

    async def sleep(self) -> None:
        await self.abort_all()
        await asyncio.sleep(self.sleep_costs.sleep_s * self.time_scale)

    async def wake(self) -> None:
        await asyncio.sleep(self.sleep_costs.wake_s * self.time_scale)

    async def load_weights(self, *, version: int, path: str | None) -> None:
        await asyncio.sleep(self.sleep_costs.weight_sync_s * self.time_scale)
        if self._replica is not None:
            self._replica.version = version

    async def transfer(self, step: PushStep, info: dict[str, Any], *, version: int) -> None:
        raise ValueError("the sim engine has no push weight transport (config validation forbids it)")
