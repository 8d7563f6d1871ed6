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
  k // step_required) and a fixed prompt length. Optionally a share of responses
  runs to the max length (``max_length_share``).
- Decode: all decoding requests of a replica advance in lock-step, one token
  per step, and a step takes ``ReplicaTiming.step_time_s(b, C)`` for ``b``
  decoding requests holding ``C`` context tokens (``sim.physics``: weights
  roofline, batch compute, KV reads growing with context). The replica keeps a
  *virtual token clock* ``V`` (tokens every running request has received since
  time 0), so each request is one heap entry ``finish_v`` and only the earliest
  finisher is scheduled.
- KV cache: a request is admitted while the contexts fit the replica's
  capacity; when decoding fills it, the newest request is preempted (recompute).
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

from shared.config import Config
from sim.engine import Engine
from sim.scenario import ReplicaTiming, WorkloadShape, engine_model

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
KV_ADMIT_WATERMARK = 0.95
"""A request is admitted while the KV cache would stay below this share (room to grow, as vLLM's
watermark leaves some)."""


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
            horizon = cfg.drift_horizon_samples or num_samples
            progress = np.minimum(1.0, np.arange(num_samples) / max(1, horizon - 1))
            median = cfg.response_tokens_median_start + progress * (
                cfg.response_tokens_median_end - cfg.response_tokens_median_start)
            response = np.rint(np.exp(np.log(median)[:, None] + cfg.response_tokens_sigma * z_resp))
            if cfg.max_length_share > 0:  # drawn last, so the other draws do not depend on it
                response[rng.random((num_samples, n)) < cfg.max_length_share] = cfg.response_tokens_max
            low = 1
        self.response: list[list[int]] = np.clip(response, low, cfg.response_tokens_max).astype(int).tolist()

    @classmethod
    def from_config(cls, config: Config) -> Workload:
        """The run's token lengths as the planner draws them: what the live sim engine decodes and the
        live sim prompts measure (one draw, so a live run and the planner train the same tokens)."""
        return cls(engine_model(config)[1], num_samples=config.data.total_rollout_steps, n=config.data.n,
                   seed=config.run.seed)

    def sample_tokens(self, k: int) -> int:
        """Tokens the trainer processes for sample k (prompt once per trajectory + responses)."""
        return self.prompt[k] * len(self.response[k]) + sum(self.response[k])


class Sample:
    """One prompt and its ``n`` trajectories; done when every trajectory finished."""

    __slots__ = ("index", "pending", "min_version", "max_version", "submitted_s", "finished_s", "cut_tokens")

    def __init__(self, index: int, n: int, now_s: float) -> None:
        self.index = index
        self.pending = n
        self.cut_tokens = 0
        """Response tokens its trajectories never generated: cut by an abort without partial rollout."""
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
                 "attempt", "join_v", "join_ctx", "replica", "attempts_total", "decode_started_s",
                 "decode_generated", "decode_integrals", "decode_s", "mean_inflight", "mean_context")

    def __init__(self, request_id: str, sample: Sample, prompt_tokens: int, target_tokens: int) -> None:
        self.request_id = request_id
        self.sample = sample
        self.prompt_tokens = prompt_tokens
        self.target_tokens = target_tokens
        self.generated = 0.0
        self.state = WAITING
        self.attempt = 0
        self.join_v = 0.0
        self.join_ctx = 0.0
        """Context (prompt + generated) when the attempt started decoding or prefilling."""
        self.replica: Replica | None = None
        self.attempts_total = 0
        self.decode_started_s = -1.0
        """When the attempt first decoded (-1: not yet); its tokens and in-flight integral then."""
        self.decode_generated = 0.0
        self.decode_integrals = (0.0, 0.0)
        self.decode_s = 0.0
        """Set when the attempt finishes: its seconds from its first decode step, and the requests its
        replica held on average meanwhile (itself included): what an engine reports of its batch."""
        self.mean_inflight = 0.0
        self.mean_context = 0.0

    @property
    def decode_tokens(self) -> int:
        """Tokens the finished attempt decoded (those of its decode_s)."""
        return int(self.generated - self.decode_generated + 1e-6)


class Replica:
    """One inference engine (standalone or hybrid) under the lock-step decode model.

    The decoding requests' contexts sum to ``C = K + b * V`` (``K`` = sum of join context - join
    V), so the step time grows linearly in ``V`` between events and the time to advance ``dV`` is
    ``s0 dV + g dV^2 / 2`` with ``g = context_token_s * b``: integrated exactly, not frozen.
    """

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
        self._decoding_order: dict[str, Request] = {}
        self._seq = 0
        self._slots = 0
        self._decoding = 0
        self._v = 0.0
        self._k = 0.0
        self._prefilling_ctx = 0.0
        self._t_last = 0.0
        self._epoch = 0
        self._prefill_free_s = 0.0
        self._busy = False
        self.tokens_decoded = 0.0
        self.tokens_prefilled = 0.0
        self.preemptions = 0
        self._requests_s = 0.0
        """Integrals of the load (requests in the replica, context tokens decoding requests hold) over
        time, as an engine keeps them (core.measure.InflightClock): each attempt's mean load."""
        self._context_s = 0.0
        self._requests_since_s = 0.0

    # -- request lifecycle ---------------------------------------------------

    def submit(self, req: Request) -> None:
        assert self.awake, f"request {req.request_id} routed to sleeping {self.replica_id}"
        req.replica = self
        req.state = WAITING
        self._count_requests()
        self.inflight[req.request_id] = req
        req.decode_started_s = -1.0
        self._waiting.append(req)
        self._fill_slots()
        self._update_busy()

    def _context_tokens(self) -> float:
        return self._k + self._decoding * self._v

    def _fits(self, req: Request) -> bool:
        if self._slots >= self.cfg.max_running_requests:
            return False
        if self._slots == 0 or self.cfg.kv_capacity_tokens == math.inf:
            return True
        self._advance()
        used = self._context_tokens() + self._prefilling_ctx
        return used + req.prompt_tokens + req.generated <= KV_ADMIT_WATERMARK * self.cfg.kv_capacity_tokens

    def _admit(self, req: Request) -> None:
        self._slots += 1
        req.state = PREFILL
        req.attempts_total += 1
        req.sample.note_version(self.version)
        tokens = req.prompt_tokens + req.generated
        req.join_ctx = tokens
        self._prefilling_ctx += tokens
        self.tokens_prefilled += tokens
        prefill_s = tokens / (self.cfg.prefill_tokens_per_s * self.speed)
        done_s = max(self.engine.now_s, self._prefill_free_s) + prefill_s
        self._prefill_free_s = done_s
        self.engine.at(done_s, self._prefill_done, req, req.attempt)

    def _prefill_done(self, req: Request, attempt: int) -> None:
        if attempt != req.attempt or req.replica is not self:
            return
        self._advance()
        self._prefilling_ctx -= req.join_ctx
        req.state = DECODE
        req.join_v = self._v
        if req.decode_started_s < 0:
            now_s = self.engine.now_s
            req.decode_started_s, req.decode_generated = now_s, req.generated
            req.decode_integrals = self._load_integrals()
        self._k += req.join_ctx - self._v
        self._decoding_order[req.request_id] = req
        self._seq += 1
        heapq.heappush(self._heap, (self._v + req.target_tokens - req.generated, self._seq, req.attempt, req))
        self._decoding += 1
        self._reschedule()

    def _step_s(self) -> float:
        return self.cfg.step_time_s(self._decoding, self.speed, self._context_tokens())

    def _advance(self) -> None:
        now = self.engine.now_s
        if self._decoding and now > self._t_last:
            dt = now - self._t_last
            s0 = self._step_s()
            g = self.cfg.context_token_s * self._decoding / self.speed
            dv = dt / s0 if g == 0.0 else 2.0 * dt / (s0 + math.sqrt(s0 * s0 + 2.0 * g * dt))
            # the context held, C = K + b V, grows linearly in V: its mean over dt is at V + dv / 2
            self._context_s += (self._k + self._decoding * (self._v + 0.5 * dv)) * dt
            self._v += dv
            self.tokens_decoded += dv * self._decoding
        self._t_last = now

    def _count_requests(self) -> None:
        """Before the requests in the replica change: their integral up to now."""
        now = self.engine.now_s
        self._requests_s += len(self.inflight) * (now - self._requests_since_s)
        self._requests_since_s = now

    def _load_integrals(self) -> tuple[float, float]:
        """(requests x seconds, context tokens x seconds) up to now; call right after `_advance`."""
        self._count_requests()
        return self._requests_s, self._context_s

    def _time_to(self, dv: float) -> float:
        g = self.cfg.context_token_s * self._decoding / self.speed
        return dv * self._step_s() + 0.5 * g * dv * dv

    def _reschedule(self) -> None:
        self._epoch += 1
        heap = self._heap
        while heap and (heap[0][3].attempt != heap[0][2] or heap[0][3].replica is not self):
            heapq.heappop(heap)
        if not heap:
            return
        dv = max(0.0, heap[0][0] - self._v)
        if self.cfg.kv_capacity_tokens != math.inf and self._decoding > 1:
            room = self.cfg.kv_capacity_tokens - self._prefilling_ctx - self._context_tokens()
            dv = min(dv, max(0.0, room / self._decoding))
        self.engine.after(self._time_to(dv), self._on_decode, self._epoch)

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
        now_s = self.engine.now_s
        requests_s, context_s = self._load_integrals() if finished else (0.0, 0.0)
        for req in finished:
            self._leave_decode(req)
            req.generated = float(req.target_tokens)
            req.state = DONE
            req.replica = None
            del self.inflight[req.request_id]
            req.decode_s = now_s - req.decode_started_s
            elapsed_s = max(req.decode_s, 1e-12)
            req.mean_inflight = (requests_s - req.decode_integrals[0]) / elapsed_s
            req.mean_context = (context_s - req.decode_integrals[1]) / elapsed_s
        if not finished and self._decoding > 1 and self._kv_full():
            self._preempt_newest()
        self._fill_slots()
        self._reschedule()
        self._update_busy()
        for req in finished:
            self.on_finish(self, req)

    def _kv_full(self) -> bool:
        used = self._context_tokens() + self._prefilling_ctx
        return used >= self.cfg.kv_capacity_tokens * (1.0 - 1e-9) - 1e-3

    def _leave_decode(self, req: Request) -> None:
        self._decoding -= 1
        self._slots -= 1
        self._k -= req.join_ctx - req.join_v
        del self._decoding_order[req.request_id]

    def _preempt_newest(self) -> None:
        """KV cache full: the newest decoding request gives its blocks back and waits to re-prefill
        (vLLM's recompute preemption); its tokens so far are kept."""
        req = self._decoding_order[next(reversed(self._decoding_order))]
        self._leave_decode(req)
        req.generated = min(float(req.target_tokens), req.generated + self._v - req.join_v)
        req.attempt += 1
        req.state = WAITING
        self._waiting.appendleft(req)
        self.preemptions += 1

    def _fill_slots(self) -> None:
        while self._waiting and not self.paused and self._fits(self._waiting[0]):
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
        self._count_requests()
        self.inflight.clear()
        self._waiting.clear()
        self._heap.clear()
        self._decoding_order.clear()
        self._slots = 0
        self._decoding = 0
        self._k = 0.0
        self._prefilling_ctx = 0.0
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
