"""The seed scenario's calibrated static runs land within 2% of the seed's measured times."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.calibrate import SEED_TARGETS, static_hours, write_params
from sim.scenario import load_scenario

SEED = Path(__file__).resolve().parent.parent / "scenarios" / "seed_qwen35_35b_a3b_32xh20.yaml"


@pytest.mark.timeout(300)
def test_calibrated_seed_static_runs_are_within_two_percent_of_the_measured_hours() -> None:
    hours = static_hours(load_scenario(SEED))
    for target, simulated in zip(SEED_TARGETS, hours, strict=True):
        assert simulated == pytest.approx(target.hours, rel=0.02), (target, simulated)


def test_write_params_rewrites_the_two_calibrated_values_and_keeps_the_comments(tmp_path: Path) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(SEED.read_text())
    write_params(path, 0.002, 0.03)
    scenario = load_scenario(path)
    assert (scenario.replica.decode_step_s, scenario.trainer.seconds_per_ktoken) == (0.002, 0.03)
    assert path.read_text().count("# calibrated") == 2
