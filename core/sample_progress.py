"""Bookkeeping of the samples a rollouter is generating, and partial-rollout retries.

Where it sits: inside the rollouter (`core.sample_lifecycle` counts the samples,
this module follows each one's trajectories), between the results it reads and
the requests it sends. Pure (no I/O, no clock): `apply` turns one
GenerateResult into the next action: nothing (stale duplicate), a retry
request (aborted, rejected or failed by the engine: continue from prompt +
partial tokens with the remaining budget, same request id so the sticky route
holds), or "trajectory done" (an engine failing one trajectory
MAX_ENGINE_ERRORS times ends it truncated). Weight versions: min = version of
the first attempt that produced tokens, max = version of the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.schema import FINISHED, FinishReason, GenerateRequest, GenerateResult, Trajectory

RETRYABLE = frozenset({FinishReason.ABORT, FinishReason.REJECTED, FinishReason.ERROR})
MAX_ENGINE_ERRORS = 3
"""Attempts of one trajectory the engine may fail (FinishReason.ERROR: an exception, e.g. out of memory)
before it ends truncated at the tokens it has, so one request that always fails cannot hold its sample,
and the run, forever."""


@dataclass
class TrajectoryProgress:
    request_id: str
    max_tokens: int
    attempt: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    min_version: int | None = None
    max_version: int | None = None
    replica_ids: list[str] = field(default_factory=list)
    generation_time_s: float = 0.0
    engine_errors: int = 0
    """Attempts that ended with FinishReason.ERROR."""
    finish_reason: FinishReason | None = None
    """Set once the trajectory is complete (or truncated by an abort without partial rollout)."""

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def to_trajectory(self, *, reward: float) -> Trajectory:
        return Trajectory(
            request_id=self.request_id, response_token_ids=self.token_ids, response_logprobs=self.logprobs,
            finish_reason=self.finish_reason or FinishReason.ABORT, reward=reward,
            min_version=self.min_version or 0, max_version=self.max_version or 0,
            num_attempts=self.attempt % ATTEMPTS_PER_EPOCH + 1, replica_ids=self.replica_ids,
            generation_time_s=self.generation_time_s,
        )


ATTEMPTS_PER_EPOCH = 1_000_000
"""Attempt numbers are epoch * this + k, so results of a crashed rollouter's attempts are ignored."""


@dataclass
class SampleProgress:
    sample_id: str
    prompt_token_ids: list[int]
    answer: str
    trajectories: list[TrajectoryProgress]

    @property
    def done(self) -> bool:
        return all(t.done for t in self.trajectories)

    def first_requests(self) -> list[GenerateRequest]:
        return [self._request(t) for t in self.trajectories]

    def trajectory(self, request_id: str) -> TrajectoryProgress:
        """The trajectory a request id ("<sample_id>/<index>") names."""
        return self.trajectories[int(request_id.rsplit("/", 1)[1])]

    def apply(self, result: GenerateResult, *, partial_rollout: bool) -> GenerateRequest | None:
        """Fold one result in; returns the retry request to send, if any."""
        traj = self.trajectory(result.request_id)
        if traj.done or result.attempt != traj.attempt:
            return None  # a duplicate or a late answer to an attempt we already retried
        if result.token_ids:
            traj.token_ids.extend(result.token_ids)
            traj.logprobs.extend(result.logprobs)
            traj.min_version = result.weight_version if traj.min_version is None else traj.min_version
            traj.max_version = result.weight_version
            traj.replica_ids.append(result.replica_id)
        traj.generation_time_s += result.generation_time_s
        remaining = traj.max_tokens - len(traj.token_ids)
        if result.finish_reason in FINISHED or remaining <= 0:
            traj.finish_reason = FinishReason.LENGTH if remaining <= 0 else result.finish_reason
            return None
        if result.finish_reason == FinishReason.ABORT and not partial_rollout and traj.token_ids:
            traj.finish_reason = FinishReason.ABORT  # truncated, as the original without partial rollout
            return None  # (aborted before its first token: started again, an empty response trains nothing)
        if result.finish_reason == FinishReason.ERROR:
            traj.engine_errors += 1
            if traj.engine_errors >= MAX_ENGINE_ERRORS:
                traj.finish_reason = FinishReason.ERROR  # given up on: truncated at what it has
                return None
        if result.finish_reason not in RETRYABLE:
            raise ValueError(f"unknown finish_reason {result.finish_reason!r} for {result.request_id}")
        traj.attempt += 1
        return self._request(traj)

    def _request(self, traj: TrajectoryProgress) -> GenerateRequest:
        return GenerateRequest(
            request_id=traj.request_id, sample_id=self.sample_id,
            prompt_token_ids=self.prompt_token_ids + traj.token_ids,
            max_tokens=traj.max_tokens - len(traj.token_ids), attempt=traj.attempt,
        )


def new_sample(*, sample_id: str, prompt_token_ids: list[int], answer: str, n: int, max_tokens: int,
               epoch: int) -> SampleProgress:
    trajectories = [TrajectoryProgress(request_id=f"{sample_id}/{i}", max_tokens=max_tokens,
                                       attempt=epoch * ATTEMPTS_PER_EPOCH) for i in range(n)]
    return SampleProgress(sample_id=sample_id, prompt_token_ids=prompt_token_ids, answer=answer,
                          trajectories=trajectories)
