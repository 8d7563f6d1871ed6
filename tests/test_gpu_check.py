"""`python -m bench.gpu_check --dry-run` passes on a CPU host and says which steps it skipped and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_the_gpu_check_dry_run_passes_on_cpu_and_names_the_steps_it_skipped(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(tmp_path), "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["passed"] and summary["dry_run"], run.stdout
    steps = summary["steps"]
    assert set(steps) == {"host", "offload", "ipc", "nccl", "vllm"}
    assert {"ipc", "vllm"} <= set(summary["skipped"])
    assert all(summary["skipped"][name] for name in summary["skipped"])  # each with its reason
    assert steps["offload"]["status"] == "pass" and steps["offload"]["checks"]["next_training_step_runs"]
    assert steps["nccl"]["checks"]["packed_broadcast_byte_identical"]  # over gloo
    assert "skipped" in run.stdout
