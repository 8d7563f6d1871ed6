"""The seed scenario's calibrated static runs land within 2% of the seed's measured times."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.calibrate import SEED_TARGETS, static_hours
from sim.scenario import load_scenario

SEED = Path(__file__).resolve().parent.parent / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml"


@pytest.mark.timeout(300)
def test_calibrated_seed_static_runs_are_within_two_percent_of_the_measured_hours() -> None:
    hours = static_hours(load_scenario(SEED))
    for target, simulated in zip(SEED_TARGETS, hours, strict=True):
        assert simulated == pytest.approx(target.hours, rel=0.02), (target, simulated)
