"""The seed-sensitivity bench (bench/seed_sensitivity.py): its verdict compares what it says it does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.policy_sweep import MECHANICS
from bench.seed_sensitivity import format_gain_table, gain_vs_best_static
from sim.plan import splits
from sim.run import simulate
from sim.scenario import load_scenario

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim_16_16_adaptive.yaml"


@pytest.fixture(scope="module")
def verdict() -> dict[str, Any]:
    """The bench's verdict on a short run of the adaptive config (16 per replica, 8 per hybrid): one plan,
    shared by the tests that read it."""
    return gain_vs_best_static(load_scenario(CONFIG).with_prompts(192))


def test_the_gain_is_the_best_adaptive_split_against_the_best_static_split(verdict: dict[str, Any]) -> None:
    base = load_scenario(CONFIG).with_prompts(192)
    every_split = {f"{t}:{r}" for t, r in splits(base)}
    assert set(verdict["adaptive_h"]) == every_split
    with_rollout_gpus = {f"{t}:{r}" for t, r in splits(base) if r > 0}  # no static run without them
    assert set(verdict["static_h"]) == with_rollout_gpus
    assert verdict["best_static"] == min(verdict["static_h"], key=verdict["static_h"].__getitem__)
    assert verdict["best_dynamic"] == min(verdict["adaptive_h"], key=verdict["adaptive_h"].__getitem__)
    ratio = verdict["adaptive_h"][verdict["best_dynamic"]] / verdict["static_h"][verdict["best_static"]]
    assert verdict["gain_vs_best_static"] == ratio - 1.0


def test_the_adaptive_runs_use_the_fast_switch_mechanics(verdict: dict[str, Any]) -> None:
    base = load_scenario(CONFIG).with_prompts(192)
    fast = base.with_split(16, 16, policy="adaptive").with_changes(MECHANICS["fast"])
    assert verdict["adaptive_h"]["16:16"] == simulate(fast).wall_s / 3600.0


def test_a_refused_variant_is_a_row_that_says_so() -> None:
    table = format_gain_table([{"variant": "no MTP", "refit": True, "refused": "MFU above 60%"}])
    assert "| no MTP | yes | refused |" in table


def test_the_searched_verdict_also_tries_doubled_concurrency_and_smaller_hybrid_shares(
        verdict: dict[str, Any]) -> None:
    searched = verdict["searched"]
    assert {"16:16 x16", "16:16 x32"} <= set(searched["static_h"])
    assert {"16:16 x16/8", "16:16 x16/4", "16:16 x32/16", "16:16 x32/8"} <= set(searched["adaptive_h"])
    assert searched["static_h"]["16:16 x16"] == verdict["static_h"]["16:16"]
    assert searched["adaptive_h"]["16:16 x16/8"] == verdict["adaptive_h"]["16:16"]
    ratio = searched["adaptive_h"][searched["best_dynamic"]] / searched["static_h"][searched["best_static"]]
    assert searched["gain_vs_best_static"] == ratio - 1.0


def test_the_searched_runs_include_the_own_concurrency_ones_so_their_best_is_no_slower(
        verdict: dict[str, Any]) -> None:
    searched = verdict["searched"]
    assert searched["static_h"][searched["best_static"]] <= verdict["static_h"][verdict["best_static"]]
    assert searched["adaptive_h"][searched["best_dynamic"]] <= verdict["adaptive_h"][verdict["best_dynamic"]]


def test_without_a_hybrid_share_the_own_concurrency_runs_are_the_hybrids_as_standalones() -> None:
    base = load_scenario(CONFIG).with_prompts(192).with_changes(
        {"async_training.hybrid_concurrent_samples_per_replica": None})
    verdict = gain_vs_best_static(base)
    assert verdict["adaptive_h"]["16:16"] == verdict["searched"]["adaptive_h"]["16:16 x16"]
    assert "16:16 x16/8" in verdict["searched"]["adaptive_h"]
