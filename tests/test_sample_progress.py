"""Partial-rollout bookkeeping (core/sample_progress.py), pure: what one result does to a trajectory."""

from __future__ import annotations

from core.sample_progress import MAX_ENGINE_ERRORS, SampleProgress, new_sample
from shared.schema import FinishReason, GenerateResult


def sample() -> SampleProgress:
    return new_sample(sample_id="s", prompt_token_ids=[1, 2], answer="4", n=1, max_tokens=8, epoch=0)


def result(progress: SampleProgress, reason: FinishReason, tokens: list[int]) -> GenerateResult:
    traj = progress.trajectories[0]
    return GenerateResult(request_id=traj.request_id, sample_id="s", replica_id="r", token_ids=tokens,
                          logprobs=[0.0] * len(tokens), finish_reason=reason, weight_version=0,
                          attempt=traj.attempt)


def test_an_engine_error_is_retried_from_the_tokens_the_trajectory_already_has() -> None:
    progress = sample()
    assert progress.apply(result(progress, FinishReason.ABORT, [7, 7]), partial_rollout=True) is not None
    retry = progress.apply(result(progress, FinishReason.ERROR, []), partial_rollout=True)
    assert retry is not None and retry.prompt_token_ids == [1, 2, 7, 7] and retry.max_tokens == 6
    assert not progress.done


def test_a_trajectory_whose_engine_keeps_failing_ends_truncated_with_the_error_as_its_reason() -> None:
    progress = sample()
    progress.apply(result(progress, FinishReason.ABORT, [7]), partial_rollout=True)
    for _ in range(MAX_ENGINE_ERRORS - 1):
        assert progress.apply(result(progress, FinishReason.ERROR, []), partial_rollout=True) is not None
    assert progress.apply(result(progress, FinishReason.ERROR, []), partial_rollout=True) is None
    assert progress.done
    trajectory = progress.trajectories[0].to_trajectory(reward=0.0)
    assert trajectory.finish_reason is FinishReason.ERROR and trajectory.response_token_ids == [7]


def test_a_late_answer_to_an_attempt_already_retried_changes_nothing() -> None:
    progress = sample()
    first = result(progress, FinishReason.ERROR, [])
    progress.apply(first, partial_rollout=True)
    assert progress.apply(first, partial_rollout=True) is None
    assert progress.trajectories[0].engine_errors == 1


def test_without_partial_rollout_an_abort_before_any_token_starts_over_one_after_ends_the_response() -> None:
    progress = sample()
    retry = progress.apply(result(progress, FinishReason.ABORT, []), partial_rollout=False)
    assert retry is not None and retry.prompt_token_ids == [1, 2] and not progress.done
    assert progress.apply(result(progress, FinishReason.ABORT, [7, 7]), partial_rollout=False) is None
    trajectory = progress.trajectories[0].to_trajectory(reward=0.0)
    assert progress.done and trajectory.finish_reason is FinishReason.ABORT
    assert trajectory.response_token_ids == [7, 7]
