"""Charts of a finished run, drawn from what the run recorded (audit.jsonl, metrics.jsonl).

Where it sits: `dynsched run` calls `write_report(out_dir)` after writing the
run's JSONL files. Nothing here talks to Redis or to a service.

- `resource_time.png`: the seed's figure from real events: one row per
  replica plus the trainer; rollout (replica serving), train (trainer
  computing; hybrid rows show it too, since hybrids are trainer GPUs),
  weight sync, switching (replica awake but not serving) and idle.
- `reward_curve.png`: mean reward of the trained samples per weight version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from core.timeline import TRAINER, Interval, timeline
from shared.schema import AuditEvent
from shared.vocab import LaneState
from sim.plots import COLORS, pyplot  # one palette for simulated and recorded runs


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_audit(path: Path) -> list[AuditEvent]:
    """The typed events of an `audit.jsonl` (one AuditEvent as a JSON object per line)."""
    return [msgspec.convert(row, AuditEvent) for row in read_jsonl(path)]


def plot_resource_time(rows: dict[str, list[Interval]], path: Path) -> None:
    plt = pyplot()
    order = sorted(r for r in rows if r.startswith("standalone")) + sorted(
        r for r in rows if r.startswith("hybrid")) + [TRAINER]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(order) + 1.5))
    for y, row in enumerate(reversed(order)):
        # Draw idle and rollout first so short sync/switch/train bars stay visible on top.
        for category in (LaneState.IDLE, LaneState.ROLLOUT, LaneState.SWITCH, LaneState.SYNC,
                         LaneState.TRAIN):
            bars = [(s, e - s) for s, e, c in rows.get(row, []) if c == category and e > s]
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLORS[category])
    ax.set_yticks(range(len(order)), list(reversed(order)))
    ax.set_xlabel("seconds since the job started")
    ax.set_xlim(left=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    # Outside the axes, to the right: over the plot it hides the top row's bars.
    legend = ax.legend(handles, list(COLORS), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_extra_artists=[legend], bbox_inches="tight")
    plt.close(fig)


def plot_reward_curve(metrics: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    points = [(m["version"], m["training/reward_mean"]) for m in metrics if "training/reward_mean" in m]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([v for v, _ in points], [r for _, r in points], marker="o")
    ax.set_xlabel("weight version")
    ax.set_ylabel("mean reward of trained samples")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: Path, *, started_at: float | None = None) -> list[Path]:
    """Draw both charts into `out_dir` (times since `started_at`, the job's start); the paths written."""
    written = []
    rows = timeline(read_audit(out_dir / "audit.jsonl"), started_at=started_at)
    if rows:
        plot_resource_time(rows, out_dir / "resource_time.png")
        written.append(out_dir / "resource_time.png")
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    if metrics:
        plot_reward_curve(metrics, out_dir / "reward_curve.png")
        written.append(out_dir / "reward_curve.png")
    return written
