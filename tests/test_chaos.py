"""The chaos bench's fault draw and its collateral check (pure; the trials themselves are a bench)."""

from __future__ import annotations

import random

from bench.chaos import collateral_restarts, draw_fault, redis_fault


def test_a_draw_picks_hang_then_term_then_kill_by_their_shares() -> None:
    kinds = [draw_fault(k / 10, hang_share=0.2, term_share=0.3) for k in range(10)]
    assert kinds == ["hang"] * 2 + ["term"] * 3 + ["kill"] * 5
    assert {draw_fault(k / 10, hang_share=0.0, term_share=0.0) for k in range(10)} == {"kill"}


def test_a_service_restarted_after_its_own_sigterm_is_not_collateral_but_a_peer_restarted_is() -> None:
    faults = [{"after_micro_step": 3, "term": "trainer"}, {"after_micro_step": 5, "hang": "rollouter"}]
    summary = {"restarts": {"trainer": 1, "controller": 1}, "hung_kills": {"rollouter": 1}}
    assert collateral_restarts(summary, faults) == {"controller": 1}


def test_redis_is_killed_unless_a_redis_hang_share_is_given_and_only_then_draws_a_number() -> None:
    rng = random.Random(7)
    assert [redis_fault(rng, redis_hang_share=0.0) for _ in range(5)] == ["kill"] * 5
    assert rng.random() == random.Random(7).random(), "no share, no draw: other seeds' faults stay"
    assert {redis_fault(random.Random(k), redis_hang_share=1.0) for k in range(5)} == {"hang"}


def test_after_a_redis_hang_no_restart_counts_as_collateral() -> None:
    faults = [{"after_micro_step": 3, "hang": "redis"}]
    summary = {"restarts": {"trainer": 1, "controller": 1}, "hung_kills": {}}
    assert collateral_restarts(summary, faults) == {}
