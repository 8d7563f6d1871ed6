"""Timing model of the workload and of one inference replica (continuous batching).

Where it sits: ``sim.run`` builds one ``Replica`` per standalone and hybrid
replica and routes ``Request`` attempts to them through the real load-balancer
state (``core.routing``). The model is deliberately small:

- Lengths: each sample has ``n`` trajectories; prompt and response lengths are
  drawn once per run from the run seed and indexed by sample position (so
  every schedule sees the same prompts and the ideal bound is
  schedule-independent): log-normal, clipped, with a response median drifting
  linearly from start to end of the run, as RL responses grow; or, without a
  ``simulator.workload`` section, the sim engine's normal(mean, std) growing by
  ``drift_per_version`` per weight version (sample k counts as version
  k // step_required) and a fixed prompt length.
- Decode: all decoding requests of a replica advance in lock-step, one token
  per step, and a step takes ``decode_step_s * (1 + b / batch_half_requests)``
  for ``b`` decoding requests. The replica keeps a *virtual token clock* ``V``
  (tokens every running request has received since time 0), so each request is
  one heap entry ``finish_v`` and only the earliest finisher is scheduled.
- Prefill: a single FIFO server per replica at ``prefill_tokens_per_s``; a
  resumed partial rollout re-prefills prompt + generated tokens (KV recomputed).
- At most ``max_running_requests`` requests prefill or decode; the rest wait.
- Abort returns partial tokens at once; a paused engine holds new requests
  until ``resume``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from sim.engine import Engine
from sim.scenario import ReplicaTiming, WorkloadShape

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class Workload:
    """Pre-drawn token lengths: ``prompt[k]`` and ``response[k, j]`` for sample k, trajectory j."""

    def __init__(self, cfg: WorkloadShape, *, num_samples: int, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        z_prompt = rng.standard_normal(num_samples)
        z_resp = rng.standard_normal((num_samples, n))
        prompt = np.exp(math.log(cfg.prompt_tokens_median) + cfg.prompt_tokens_sigma * z_prompt)
        self.prompt: list[int] = np.clip(np.rint(prompt), 1, cfg.prompt_tokens_max).astype(int).tolist()
        if cfg.kind == "normal":  # as the sim engine draws: int(normal(mean, std)), mean growing per version
            version = np.arange(num_samples) // max(1, cfg.samples_per_version)
            mean = cfg.response_tokens_median_start * (1.0 + cfg.drift_per_version * version)
            response = np.trunc(mean[:, None] + cfg.response_tokens_sigma * z_resp)
            low = cfg.response_tokens_min
        else:
            progress = np.arange(num_samples) / max(1, num_samples - 1)
            median = cfg.response_tokens_median_start + progress * (
                cfg.response_tokens_median_end - cfg.response_tokens_median_start)
            response = np.rint(np.exp(np.log(median)[:, None] + cfg.response_tokens_sigma * z_resp))
            low = 1
        self.response: list[list[int]] = np.clip(response, low, cfg.response_tokens_max).astype(int).tolist()

    def sample_tokens(self, k: int) -> int:
        """Tokens the trainer processes for sample k (prompt once per trajectory + responses)."""
        return self.prompt[k] * len(self.response[k]) + sum(self.response[k])


class Sample:
    """One prompt and its ``n`` trajectories; done when every trajectory finished."""

    __slots__ = ("index", "pending", "min_version", "max_version", "submitted_s", "finished_s")

    def __init__(self, index: int, n: int, now_s: float) -> None:
        self.index = index
        self.pending = n
        self.min_version = -1
        self.max_version = -1
        self.submitted_s = now_s
        self.finished_s = -1.0

    def note_version(self, version: int) -> None:
        if self.min_version < 0:
            self.min_version = version
        self.max_version = version


class Request:
    """One trajectory of a sample; generated over one or more attempts (partial rollout)."""

    __slots__ = ("request_id", "sample", "prompt_tokens", "target_tokens", "generated", "state",
                 "attempt", "join_v", "replica", "attempts_total")

    def __init__(self, request_id: str, sample: Sample, prompt_tokens: int, target_tokens: int) -> None:
        self.request_id = request_id
        self.sample = sample
        self.prompt_tokens = prompt_tokens
        self.target_tokens = target_tokens
        self.generated = 0.0
        self.state = WAITING
        self.attempt = 0
        self.join_v = 0.0
        self.replica: Replica | None = None
        self.attempts_total = 0


class Replica:
    """One inference engine (standalone or hybrid) under the lock-step decode model."""

    def __init__(self, engine: Engine, cfg: ReplicaTiming, *, replica_id: str, hybrid: bool,
                 on_finish: Callable[[Replica, Request], None],
                 on_busy: Callable[[Replica, bool], None]) -> None:
        self.engine = engine
        self.cfg = cfg
        self.replica_id = replica_id
        self.hybrid = hybrid
        self.speed = cfg.hybrid_speed_factor if hybrid else 1.0
        self.on_finish = on_finish
        self.on_busy = on_busy
        self.awake = not hybrid
        self.paused = False
        self.version = 0
        self.inflight: dict[str, Request] = {}
        self._waiting: deque[Request] = deque()
        self._heap: list[tuple[float, int, int, Request]] = []
        self._seq = 0
        self._slots = 0
        self._decoding = 0
        self._v = 0.0
        self._t_last = 0.0
        self._epoch = 0
        self._prefill_free_s = 0.0
        self._busy = False
        self.tokens_decoded = 0.0
        self.tokens_prefilled = 0.0

    # -- request lifecycle ---------------------------------------------------

    def submit(self, req: Request) -> None:
        assert self.awake, f"request {req.request_id} routed to sleeping {self.replica_id}"
        req.replica = self
        req.state = WAITING
        self.inflight[req.request_id] = req
        if self.paused or self._slots >= self.cfg.max_running_requests:
            self._waiting.append(req)
        else:
            self._admit(req)
        self._update_busy()

    def _admit(self, req: Request) -> None:
        self._slots += 1
        req.state = PREFILL
        req.attempts_total += 1
        req.sample.note_version(self.version)
        tokens = req.prompt_tokens + req.generated
        self.tokens_prefilled += tokens
        prefill_s = tokens / (self.cfg.prefill_tokens_per_s * self.speed)
        done_s = max(self.engine.now_s, self._prefill_free_s) + prefill_s
        self._prefill_free_s = done_s
        self.engine.at(done_s, self._prefill_done, req, req.attempt)

    def _prefill_done(self, req: Request, attempt: int) -> None:
        if attempt != req.attempt or req.replica is not self:
            return
        self._advance()
        req.state = DECODE
        req.join_v = self._v
        self._seq += 1
        heapq.heappush(self._heap, (self._v + req.target_tokens - req.generated, self._seq, req.attempt, req))
        self._decoding += 1
        self._reschedule()

    def _advance(self) -> None:
        now = self.engine.now_s
        if self._decoding:
            dv = (now - self._t_last) / self.cfg.step_time_s(self._decoding, self.speed)
            self._v += dv
            self.tokens_decoded += dv * self._decoding
        self._t_last = now

    def _reschedule(self) -> None:
        self._epoch += 1
        heap = self._heap
        while heap and (heap[0][3].attempt != heap[0][2] or heap[0][3].replica is not self):
            heapq.heappop(heap)
        if heap:
            dt = max(0.0, heap[0][0] - self._v) * self.cfg.step_time_s(self._decoding, self.speed)
            self.engine.after(dt, self._on_decode, self._epoch)

    def _on_decode(self, epoch: int) -> None:
        if epoch != self._epoch:
            return
        self._advance()
        heap = self._heap
        finished: list[Request] = []
        while heap and heap[0][0] <= self._v + 1e-6:
            _, _, attempt, req = heapq.heappop(heap)
            if attempt != req.attempt or req.replica is not self:
                continue
            finished.append(req)
        for req in finished:
            self._decoding -= 1
            self._slots -= 1
            req.generated = float(req.target_tokens)
            req.state = DONE
            req.replica = None
            del self.inflight[req.request_id]
        self._fill_slots()
        self._reschedule()
        self._update_busy()
        for req in finished:
            self.on_finish(self, req)

    def _fill_slots(self) -> None:
        while self._waiting and not self.paused and self._slots < self.cfg.max_running_requests:
            self._admit(self._waiting.popleft())

    def _update_busy(self) -> None:
        busy = bool(self.inflight) and not self.paused
        if busy != self._busy:
            self._busy = busy
            self.on_busy(self, busy)

    # -- engine control ------------------------------------------------------

    def abort_all(self) -> list[Request]:
        """Abort every in-flight attempt; decoded tokens are kept on the request (partial rollout)."""
        self._advance()
        aborted = list(self.inflight.values())
        for req in aborted:
            if req.state == DECODE:
                req.generated = min(float(req.target_tokens), req.generated + self._v - req.join_v)
            req.attempt += 1
            req.state = WAITING
            req.replica = None
        self.inflight.clear()
        self._waiting.clear()
        self._heap.clear()
        self._slots = 0
        self._decoding = 0
        self._prefill_free_s = self.engine.now_s
        self._epoch += 1
        self._update_busy()
        return aborted

    def pause(self) -> None:
        self.paused = True
        self._update_busy()

    def resume(self) -> None:
        self.paused = False
        self._fill_slots()
        self._update_busy()

    def sleep(self) -> None:
        assert not self.inflight, f"{self.replica_id} put to sleep with requests in flight"
        self.awake = False

    def wake(self) -> None:
        self.awake = True

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)
