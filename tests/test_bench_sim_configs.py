"""The live side-by-side bench (bench/bench_sim_configs.py): another time scale runs a rescaled copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import bench_sim_configs

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim_16_16_adaptive.yaml"


def test_a_time_scale_runs_a_rescaled_copy_and_reports_modelled_seconds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Path] = []

    def fake_run_job(config_path: Path, out_dir: Path, **_: Any) -> dict[str, Any]:
        ran.append(Path(config_path))
        return {"wall_time_s": 150.0, "samples": {}, "switches": {}}

    monkeypatch.setattr(bench_sim_configs, "run_job", fake_run_job)
    row = bench_sim_configs.run_config(CONFIG, tmp_path / "out", timeout_s=60.0, time_scale=0.1)
    assert yaml.safe_load(ran[0].read_text())["run"]["time_scale"] == 0.1
    assert ran[0].parent == tmp_path / "out" and CONFIG.read_text() != ran[0].read_text()
    assert (row["time_scale"], row["wall_time_s"], row["modelled_s"]) == (0.1, 150.0, 1500.0)


def test_a_config_keeps_its_own_time_scale_when_none_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = {"wall_time_s": 100.0, "samples": {}, "switches": {}}
    monkeypatch.setattr(bench_sim_configs, "run_job", lambda config_path, out_dir, **_: summary)
    row = bench_sim_configs.run_config(CONFIG, tmp_path / "out", timeout_s=60.0)
    assert (row["time_scale"], row["modelled_s"]) == (0.05, 2000.0)


def test_a_time_scale_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="--time-scale must be > 0"):
        bench_sim_configs.main(["--time-scale", "0", "--config", str(CONFIG)])


def test_the_startup_ends_at_the_controllers_first_decision_or_command(tmp_path: Path) -> None:
    events = [{"kind": "replica_state", "subject": "hybrid_0", "t": 103.0},
              {"kind": "command", "subject": "controller", "t": 105.0, "duration_s": 0.75},
              {"kind": "decision", "subject": "controller", "t": 105.5}]
    (tmp_path / "audit.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert bench_sim_configs.startup_s(tmp_path, 100.0) == 4.25  # a command's t is its end
    assert bench_sim_configs.startup_s(tmp_path / "missing", 100.0) is None


def test_repeated_runs_are_interleaved_and_each_config_reports_its_median(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    static, dynamic = CONFIG.with_name("sim_16_16_static.yaml"), CONFIG
    walls = iter([100.0, 90.0, 104.0, 95.0, 98.0, 91.0])
    order: list[str] = []

    def fake_run_job(config_path: Path, out_dir: Path, **_: Any) -> dict[str, Any]:
        order.append(out_dir.name)
        return {"wall_time_s": next(walls), "samples": {}, "switches": {}}

    monkeypatch.setattr(bench_sim_configs, "run_job", fake_run_job)
    out = tmp_path / "result.json"
    bench_sim_configs.main(["--repeat", "3", "--config", str(static), "--config", str(dynamic),
                            "--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    assert order == ["sim_16_16_static-r1", "sim_16_16_adaptive-r1", "sim_16_16_static-r2",
                     "sim_16_16_adaptive-r2", "sim_16_16_static-r3", "sim_16_16_adaptive-r3"]
    result = json.loads(out.read_text())
    assert result["median_wall_time_s"] == {"sim_16_16_static": 100.0, "sim_16_16_adaptive": 91.0}


def test_a_repeat_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="--repeat must be >= 1"):
        bench_sim_configs.main(["--repeat", "0", "--config", str(CONFIG)])
