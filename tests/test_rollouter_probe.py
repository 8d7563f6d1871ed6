"""The rollouter probe (bench/rollouter_probe.py) on a shortened seed run: its numbers hang together."""

from __future__ import annotations

import pytest

from bench.rollouter_probe import probe
from bench.where_time_goes import SEED
from sim.run import Simulation
from sim.scenario import load_scenario


def test_a_static_seed_run_starts_one_version_of_samples_per_version_and_obeys_littles_law() -> None:
    scenario = load_scenario(SEED).with_prompts(1280).with_split(16, 16, policy="static")
    summary = probe(Simulation(scenario))
    assert summary["activations"] == 0
    assert summary["starts_per_version"] == pytest.approx(64.0, abs=3.0)  # step_required; the feed ends early
    assert summary["mean_max_concurrent"] == 32.0  # 2 standalones x 16 samples
    assert summary["littles_law_latency_s"] == pytest.approx(summary["latency_mean_s"], rel=0.15)
    assert set(summary["decoding_batch"]) == {"standalone_0", "standalone_1"}
