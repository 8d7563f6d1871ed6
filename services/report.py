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

import dataclasses
import json
from pathlib import Path
from typing import Any

import matplotlib
import msgspec

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from core.controller import SyncWeights  # noqa: E402
from shared.schema import AuditEvent, AuditKind, AuditPhase, ReplicaState  # noqa: E402
from shared.vocab import LaneState  # noqa: E402
from sim.plots import COLORS  # noqa: E402  (one palette for simulated and recorded runs)

_STATE_CATEGORY = {ReplicaState.SERVING: LaneState.ROLLOUT, ReplicaState.PAUSED: LaneState.SWITCH,
                   ReplicaState.SLEEPING: LaneState.IDLE}
TRAINER = "trainer"
"""The subject of the trainer's audit events, and the chart row of its compute."""

Interval = tuple[float, float, LaneState]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_audit(path: Path) -> list[AuditEvent]:
    """The typed events of an `audit.jsonl` (one AuditEvent as a JSON object per line)."""
    return [msgspec.convert(row, AuditEvent) for row in read_jsonl(path)]


def timeline(events: list[AuditEvent]) -> dict[str, list[Interval]]:
    """Per row (replica ids, 'trainer'): (start, end, category) intervals, times relative to the
    first event."""
    if not events:
        return {}
    t0 = events[0].t
    events = [dataclasses.replace(e, t=e.t - t0) for e in events]
    rows = _replica_states(events)
    train = _train_intervals(events)
    for event in events:
        if event.kind is AuditKind.COMMAND and event.command == SyncWeights.kind:
            duration_s = event.duration_s or 0.0
            for replica_id in set(event.replica_ids) & set(rows):
                # A sync can start before the first recorded event (a worker still booting).
                rows[replica_id].append((max(0.0, event.t - duration_s), event.t, LaneState.SYNC))
    for replica_id in rows:
        if replica_id.startswith("hybrid"):
            rows[replica_id] += train  # hybrids sleep while their GPUs train
    rows[TRAINER] = train
    return rows


def _replica_states(events: list[AuditEvent]) -> dict[str, list[Interval]]:
    rows: dict[str, list[Interval]] = {}
    since: dict[str, tuple[float, LaneState]] = {}
    for event in events:
        if event.kind is not AuditKind.REPLICA_STATE or event.state is None:
            continue
        subject = event.subject
        if subject in since:
            rows[subject].append((since[subject][0], event.t, since[subject][1]))
        rows.setdefault(subject, [])
        since[subject] = (event.t, _STATE_CATEGORY[event.state])
    for subject, (start, category) in since.items():
        rows[subject].append((start, events[-1].t, category))
    return rows


def _train_intervals(events: list[AuditEvent]) -> list[Interval]:
    intervals: list[Interval] = []
    started = None
    for event in (e for e in events if e.kind is AuditKind.PHASE and e.subject == TRAINER):
        if event.phase is AuditPhase.TRAIN_START:
            started = event.t
        elif event.phase is AuditPhase.TRAIN_END and started is not None:
            intervals.append((started, event.t, LaneState.TRAIN))
            started = None
    return intervals


def plot_resource_time(rows: dict[str, list[Interval]], path: Path) -> None:
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
    ax.set_xlabel("seconds since start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.12))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_reward_curve(metrics: list[dict[str, Any]], path: Path) -> None:
    points = [(m["version"], m["training/reward_mean"]) for m in metrics if "training/reward_mean" in m]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([v for v, _ in points], [r for _, r in points], marker="o")
    ax.set_xlabel("weight version")
    ax.set_ylabel("mean reward of trained samples")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: Path) -> list[Path]:
    """Draw both charts into `out_dir`; returns the paths written."""
    written = []
    rows = timeline(read_audit(out_dir / "audit.jsonl"))
    if rows:
        plot_resource_time(rows, out_dir / "resource_time.png")
        written.append(out_dir / "resource_time.png")
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    if metrics:
        plot_reward_curve(metrics, out_dir / "reward_curve.png")
        written.append(out_dir / "reward_curve.png")
    return written
