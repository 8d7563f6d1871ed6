"""Per-step observables of one run: what calibration fits and validation compares.

Where it sits: between what a run reports and ``sim.calibrate`` / ``sim.validate``. Three sources
give the same ``Observed``:

- a published row (``simulator.published`` in a scenario, ``shared.sim_config.PublishedRow``);
- a run's ``metrics.jsonl`` (``dynsched run``) or the simulator's ``cycles.jsonl``: one line per sync
  cycle with the cycle's summed ``timing_s/step``, ``timing_s/gen``, ``timing_s/update_actor`` (or
  ``dynamic_resource/train_compute_time_s``), the last ``dynamic_resource/mq_size``, and optionally
  ``sim/trained_tokens``; the per-step value is the sum over cycles / the number of trainer steps;
- a ``SimResult``.

Every field but the label may be missing (None): a row gives what was published.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.sim_config import PublishedRow
from sim.result import SimResult

OBSERVABLES = ("step_s", "gen_s", "update_s", "tokens_per_step", "mq_size")


@dataclass(frozen=True, kw_only=True)
class Observed:
    label: str
    train_gpus: int
    rollout_gpus: int
    step_s: float | None = None
    gen_s: float | None = None
    update_s: float | None = None
    tokens_per_step: float | None = None
    mq_size: float | None = None
    hours: dict[int, float] = field(default_factory=dict)
    """Wall hours after N trainer steps."""

    def get(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)


def from_row(row: PublishedRow) -> Observed:
    return Observed(label=row.label, train_gpus=row.train_gpus, rollout_gpus=row.rollout_gpus,
                    step_s=row.step_s, gen_s=row.gen_s, update_s=row.update_s,
                    tokens_per_step=row.tokens_per_step, mq_size=row.mq_size, hours=dict(row.hours))


def from_result(res: SimResult, *, label: str = "", step_unit: str = "micro_step") -> Observed:
    """Per-step means of a simulated run; ``step_unit`` 'version' counts a step per weight version (as
    verl's tables do: ``timing_s/*`` summed over the version's micro-steps, hours after N versions)."""
    per_version = step_unit == "version"
    steps = max(1, res.versions if per_version else res.micro_steps)
    cycles = res.cycles

    def per_step(key: str) -> float:
        return sum(c[key] for c in cycles) / steps

    mq = [c["dynamic_resource/mq_size"] for c in cycles]
    return Observed(label=label or res.label, train_gpus=res.train_gpus, rollout_gpus=res.rollout_gpus,
                    step_s=per_step("timing_s/step"), gen_s=per_step("timing_s/gen"),
                    update_s=per_step("dynamic_resource/train_compute_time_s"),
                    tokens_per_step=res.tokens["trained"] / steps, mq_size=sum(mq) / max(1, len(mq)),
                    hours=_hours_by_step(res, per_version=per_version))


def _hours_by_step(res: SimResult, *, per_version: bool = False) -> dict[int, float]:
    """Wall hours at every sync (trainer steps or versions done -> hours) and at the end."""
    per_cycle = 1 if per_version else res.micro_steps // max(1, len(res.cycles))
    hours = {int(c["version"]) * per_cycle: c["time_s"] / 3600.0 for c in res.cycles}
    hours.setdefault(res.versions if per_version else res.micro_steps, res.wall_s / 3600.0)
    return hours


def from_metrics_jsonl(path: str | Path, *, label: str, train_gpus: int, rollout_gpus: int,
                       steps_per_cycle: int) -> Observed:
    """Per-step means over every cycle line of a run's metrics.jsonl (or the simulator's cycles.jsonl)."""
    lines = [json.loads(text) for text in Path(path).read_text().splitlines() if text.strip()]
    if not lines:
        raise ValueError(f"{path}: no cycle lines to observe")
    steps = steps_per_cycle * len(lines)

    def per_step(*keys: str) -> float | None:
        for key in keys:
            if all(key in line for line in lines):
                return sum(float(line[key]) for line in lines) / steps
        return None

    mq = [float(line["dynamic_resource/mq_size"]) for line in lines if "dynamic_resource/mq_size" in line]
    end = _end_time_s(lines[-1])
    return Observed(label=label, train_gpus=train_gpus, rollout_gpus=rollout_gpus,
                    step_s=per_step("timing_s/step"), gen_s=per_step("timing_s/gen"),
                    update_s=per_step("timing_s/update_actor", "dynamic_resource/train_compute_time_s"),
                    tokens_per_step=per_step("sim/trained_tokens"),
                    mq_size=sum(mq) / len(mq) if mq else None,
                    hours={steps: end / 3600.0} if end is not None else {})


def _end_time_s(line: dict[str, Any]) -> float | None:
    for key in ("time_s", "t_s"):
        if key in line:
            return float(line[key])
    return None
