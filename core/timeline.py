"""Which replica did what when, rebuilt from the audit stream's typed events: the resource-time chart's data.

Where it sits: pure; `services/report.py` draws it into resource_time.png after a run, and the
controller's live dashboard (services/controller/dashboard.py) serves it for the last minutes.
Lanes (shared.vocab.LaneState): rollout (replica serving), train (trainer computing; hybrid rows
show it too, since hybrids are trainer GPUs), sync (weight sync), switch (replica awake but not
serving), idle.
"""

from __future__ import annotations

import dataclasses

from core.controller import SyncWeights
from shared.schema import AuditEvent, AuditKind, AuditPhase, ReplicaState
from shared.vocab import LaneState

_STATE_LANE = {ReplicaState.SERVING: LaneState.ROLLOUT, ReplicaState.PAUSED: LaneState.SWITCH,
               ReplicaState.SLEEPING: LaneState.IDLE}
TRAINER = "trainer"
"""The subject of the trainer's audit events, and the chart row of its compute."""

Interval = tuple[float, float, LaneState]


def timeline(events: list[AuditEvent], *, started_at: float | None = None,
             until: float | None = None) -> dict[str, list[Interval]]:
    """Per row (replica ids, 'trainer'): (start, end, lane) intervals, in seconds since `started_at`
    (the job's start; the first event when not given). Open intervals end at `until` (default: the
    last event). Before a replica's first event it is starting up (idle)."""
    if not events:
        return {}
    t0 = events[0].t if started_at is None else min(started_at, events[0].t)
    end_s = (max(until, events[-1].t) if until is not None else events[-1].t) - t0
    events = [dataclasses.replace(e, t=e.t - t0) for e in events]
    rows = _replica_states(events, end_s)
    train = _train_intervals(events)
    for event in events:
        if event.kind is AuditKind.COMMAND and event.command == SyncWeights.kind:
            duration_s = event.duration_s or 0.0
            for replica_id in set(event.replica_ids or ()) & set(rows):
                # A sync can start before the first recorded event (a worker still booting).
                rows[replica_id].append((max(0.0, event.t - duration_s), event.t, LaneState.SYNC))
    for replica_id in rows:
        if replica_id.startswith("hybrid"):
            rows[replica_id] += train  # hybrids sleep while their GPUs train
    rows[TRAINER] = train
    return rows


def _replica_states(events: list[AuditEvent], end_s: float) -> dict[str, list[Interval]]:
    rows: dict[str, list[Interval]] = {}
    since: dict[str, tuple[float, LaneState]] = {}
    for event in events:
        if event.kind is not AuditKind.REPLICA_STATE or event.state is None:
            continue
        subject = event.subject
        if subject in since:
            rows[subject].append((since[subject][0], event.t, since[subject][1]))
        rows.setdefault(subject, [])
        since[subject] = (event.t, _STATE_LANE[event.state])
    for subject, (start, lane) in since.items():
        rows[subject].append((start, end_s, lane))
    for intervals in rows.values():  # from the job's start to the first event: booting, loading weights
        if intervals and intervals[0][0] > 0:
            intervals.insert(0, (0.0, intervals[0][0], LaneState.IDLE))
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
