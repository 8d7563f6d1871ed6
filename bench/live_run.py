"""A short real sim run for the benches and tests that drive one from outside (chaos, hung services,
faults, Prometheus, a browser): configs/sim_small.yaml at a chosen time scale, in its own namespace,
its admin API on a free port; and a poll that names what it waited for."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from services import launcher
from shared.config import config_from_dict, config_to_dict, replace_config

ROOT = Path(__file__).resolve().parent.parent


def live_config(tmp_path: Path, *, time_scale: float, policy: str = "fixed_ratio",
                total_rollout_steps: int = 384, run: dict[str, Any] | None = None,
                changes: dict[str, Any] | None = None) -> Path:
    """configs/sim_small.yaml at `time_scale` (0.02 there: ~15 s), switching every cycle by default;
    `run` overrides keys of its run section, `changes` any dotted key (`async_training.require_batches`)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "sim_small.yaml").read_text())
    data["run"].update(time_scale=time_scale, namespace=f"live{time.monotonic_ns()}", admin_port=0,
                       **(run or {}))
    data["data"]["total_rollout_steps"] = total_rollout_steps
    data["async_training"]["dynamic_schedule_policy"] = policy
    config = replace_config(config_from_dict(data), changes or {})  # an unknown key is a ConfigError
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    return path


def wait_for(predicate: Any, *, timeout_s: float, what: str, job: launcher.Job | None = None) -> Any:
    """Poll `predicate()` until it returns something truthy (returned); fail naming `what`."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if value := predicate():
            return value
        if job is not None:
            job.poll()  # a crashed service fails with its log, not a timeout
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
