"""What one simulated run produced: summary, per-cycle metrics, time series, GPU lanes.

Where it sits: ``sim.run`` fills a ``SimResult``; ``sim.cli`` prints it and
writes JSON/JSONL, ``sim.plots`` draws it. Plain data only.

GPU lanes: one lane per 8-GPU group (``gpus_per_replica``), in the seed
figure's order: standalone rollout pool first, then the trainer GPUs (which
host the hybrid replicas). A lane is in one ``LaneState`` at any time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.metrics import trainer_idle_ratio
from shared.vocab import LaneState


class Timeline:
    """State transitions per lane; ``set`` is a no-op when the state does not change."""

    def __init__(self, lanes: list[str]) -> None:
        self.lanes = list(lanes)
        self.changes: dict[str, list[tuple[float, LaneState]]] = {lane: [(0.0, LaneState.IDLE)]
                                                                  for lane in lanes}

    def set(self, lane: str, state: LaneState, now_s: float) -> None:
        changes = self.changes[lane]
        if changes[-1][1] == state:
            return
        if changes[-1][0] == now_s:
            changes.pop()
            if changes and changes[-1][1] == state:
                return
        changes.append((now_s, state))

    def intervals(self, lane: str, end_s: float) -> list[tuple[float, float, LaneState]]:
        changes = self.changes[lane]
        out = []
        for (t0, state), (t1, _) in zip(changes, [*changes[1:], (end_s, LaneState.IDLE)], strict=False):
            if t1 > t0:
                out.append((t0, min(t1, end_s), state))
        return out

    def seconds_by_state(self, end_s: float) -> dict[LaneState, float]:
        """Lane-seconds per state summed over lanes (multiply by GPUs per lane for GPU-seconds)."""
        totals = dict.fromkeys(LaneState, 0.0)
        for lane in self.lanes:
            for t0, t1, state in self.intervals(lane, end_s):
                totals[state] += t1 - t0
        return totals


@dataclass
class SimResult:
    scenario: str
    policy: str
    train_gpus: int
    rollout_gpus: int
    dynamic: bool
    wall_s: float = 0.0
    ideal_bound_s: float = 0.0
    activations: int = 0
    deactivations: int = 0
    versions: int = 0
    micro_steps: int = 0
    samples: dict[str, int] = field(default_factory=dict)
    """fed, generating, queued, trained, dropped (conservation: fed = the other four)."""
    cycles: list[dict[str, float]] = field(default_factory=list)
    """One record per sync cycle: section-4 metrics plus timings."""
    mq_series: list[tuple[float, int]] = field(default_factory=list)
    """(time, mq_size) right after each trainer micro-step."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """The policy's audited decisions in order, each the live audit stream's `decision` record plus its
    `version`: the numbers each decision compared, as the live controller audits them."""
    sample_lag_versions: dict[int, int] = field(default_factory=dict)
    """Trained samples per lag: the trainer's version minus the version whose weights generated the
    sample's first tokens (0 = on-policy). While the rollouter reaches its staleness limit every version,
    the mean is fixed by that limit (the versions samples start in and are trained in are then set by
    counts alone); the samples in flight and the policy only move the tail."""
    timeline: Timeline | None = None
    gpus_per_lane: int = 8
    tokens: dict[str, float] = field(default_factory=dict)
    events_processed: int = 0
    runtime_s: float = 0.0
    """Host seconds the simulation took."""

    @property
    def label(self) -> str:
        kind = self.policy if self.dynamic else "static"
        return f"{self.train_gpus}-{self.rollout_gpus} {kind}"

    @property
    def bound_ratio(self) -> float:
        return self.wall_s / self.ideal_bound_s if self.ideal_bound_s > 0 else float("nan")

    def gpu_seconds_by_state(self) -> dict[LaneState, float]:
        if self.timeline is None:
            return {}
        lane_s = self.timeline.seconds_by_state(self.wall_s)
        return {state: s * self.gpus_per_lane for state, s in lane_s.items()}

    def busy_fraction(self) -> float:
        """Share of all GPU-seconds spent generating or training (the physical utilization)."""
        by_state = self.gpu_seconds_by_state()
        total = sum(by_state.values())
        return (by_state[LaneState.ROLLOUT] + by_state[LaneState.TRAIN]) / total if total > 0 else 0.0

    def mean_sample_lag(self) -> float:
        """Mean versions between a trained sample's first tokens and its training."""
        trained = sum(self.sample_lag_versions.values())
        return sum(lag * n for lag, n in self.sample_lag_versions.items()) / trained if trained else 0.0

    def stale_tail_share(self, *, versions: int = 2) -> float:
        """Share of trained samples at least `versions` behind the trainer."""
        trained = sum(self.sample_lag_versions.values())
        behind = sum(n for lag, n in self.sample_lag_versions.items() if lag >= versions)
        return behind / trained if trained else 0.0

    def trainer_idle_ratio(self) -> float:
        """`fully_async/trainer/idle_ratio` over the whole run: Σtiming_s/gen / Σtiming_s/step."""
        return trainer_idle_ratio([c.get("timing_s/gen", 0.0) for c in self.cycles],
                                  [c.get("timing_s/step", 0.0) for c in self.cycles])

    def mean_mq_size(self) -> float:
        """Mean of `dynamic_resource/mq_size` over the sync cycles (queue size after each cycle's
        last step)."""
        return _mean(self.cycles, "dynamic_resource/mq_size")

    def summary(self) -> dict[str, Any]:
        utilization = _mean(self.cycles, "dynamic_resource/resource_utilization")
        return {
            "label": self.label,
            "scenario": self.scenario,
            "policy": self.policy if self.dynamic else "static",
            "train_gpus": self.train_gpus,
            "rollout_gpus": self.rollout_gpus,
            "wall_s": round(self.wall_s, 1),
            "wall_h": round(self.wall_s / 3600.0, 3),
            "ideal_bound_h": round(self.ideal_bound_s / 3600.0, 3),
            "ratio_to_bound": round(self.bound_ratio, 3),
            "activations": self.activations,
            "deactivations": self.deactivations,
            "versions": self.versions,
            # The per-cycle values mq_size.png draws (the seed's metric), so table and chart agree.
            "mean_mq_size": round(self.mean_mq_size(), 2),
            "mean_sample_lag_versions": round(self.mean_sample_lag(), 3),
            "share_lagging_2_versions": round(self.stale_tail_share(versions=2), 4),
            "gpu_busy_fraction": round(self.busy_fraction(), 3),
            "mean_resource_utilization": round(utilization, 3),
            "samples": dict(self.samples),
            "events_processed": self.events_processed,
            "runtime_s": round(self.runtime_s, 2),
        }

    def to_dict(self, *, with_series: bool = True) -> dict[str, Any]:
        data = self.summary()
        data["tokens"] = {k: round(v) for k, v in self.tokens.items()}
        data["gpu_seconds_by_state"] = {k: round(v) for k, v in self.gpu_seconds_by_state().items()}
        if with_series:
            data["cycles"] = self.cycles
            data["mq_series"] = [[round(t, 2), q] for t, q in self.mq_series]
            data["decisions"] = self.decisions
        return data


def _mean(rows: list[dict[str, float]], key: str) -> float:
    values = [row[key] for row in rows if key in row]
    return sum(values) / len(values) if values else 0.0
