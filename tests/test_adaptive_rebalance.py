"""Pure unit tests of the adaptive policy's rebalance choice (policies/adaptive_rebalance.py)."""

from __future__ import annotations

import pytest

from policies.adaptive_rebalance import (
    REBALANCE_MEMORY,
    REBALANCE_RETRY_EVERY,
    REBALANCE_TRIALS,
    choose_rebalance,
    credit_fill_rate,
    new_fill_rates,
)


def test_each_choice_is_tried_before_either_is_kept_skipping_first():
    rates = new_fill_rates()
    choices = []
    for decision in range(1, 2 * REBALANCE_TRIALS + 1):
        choice, why = choose_rebalance(rates, decision)
        assert why == "trying each choice"
        choices.append(choice)
        credit_fill_rate(rates, choice, 1.0)
    assert choices == ["skip"] * REBALANCE_TRIALS + ["rebalance"] * REBALANCE_TRIALS


def test_after_the_trials_the_faster_filling_choice_is_kept_and_the_other_re_measured_now_and_then():
    rates = {"skip": [1.0, REBALANCE_TRIALS], "rebalance": [2.0, REBALANCE_TRIALS]}
    picks = [choose_rebalance(rates, decision) for decision in range(1, 2 * REBALANCE_RETRY_EVERY + 1)]
    assert [choice for choice, _ in picks].count("skip") == 2
    assert picks[REBALANCE_RETRY_EVERY - 1] == ("skip", "re-measuring the other choice")
    assert picks[0] == ("rebalance", "faster fill measured")


def test_a_tie_keeps_the_hybrids_own_work_and_skips_the_rebalance():
    assert choose_rebalance({"skip": [1.0, 5], "rebalance": [1.0, 5]}, 1)[0] == "skip"


def test_the_fill_rate_is_the_mean_of_the_last_windows_so_one_noisy_window_cannot_flip_it():
    rates = new_fill_rates()
    for _ in range(3 * REBALANCE_MEMORY):
        credit_fill_rate(rates, "skip", 1.0)
    credit_fill_rate(rates, "skip", 11.0)
    assert rates["skip"][0] == pytest.approx(1.0 + 10.0 / REBALANCE_MEMORY)
    assert rates["skip"][1] == 3 * REBALANCE_MEMORY + 1
