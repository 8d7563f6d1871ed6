"""Which replica did what when, rebuilt from the audit stream's events: the resource-time chart's data.

Where it sits: pure; `services/report.py` draws it into resource_time.png after a run, and the
controller's live dashboard (services/controller/dashboard.py) serves it for the last minutes.
An event is a dict with `t` (unix seconds), `kind`, `subject` and `detail` (schema.AuditEvent).
Categories: rollout (replica serving), train (trainer computing; hybrid rows show it too, since
hybrids are trainer GPUs), sync (weight sync), switch (replica awake but not serving), idle.
"""

from __future__ import annotations

from typing import Any

_STATE_CATEGORY = {"serving": "rollout", "paused": "switch", "sleeping": "idle"}

Interval = tuple[float, float, str]


def timeline(events: list[dict[str, Any]], *, started_at: float | None = None) -> dict[str, list[Interval]]:
    """Per row (replica ids, 'trainer'): (start, end, category) intervals, in seconds since `started_at`
    (the job's start; the first event when not given). Before a replica's first event it is starting up."""
    if not events:
        return {}
    t0 = events[0]["t"] if started_at is None else min(started_at, events[0]["t"])
    events = [{**e, "t": e["t"] - t0} for e in events]
    rows = _replica_states(events)
    train = _train_intervals(events)
    for event in events:
        if event["kind"] == "command" and event["detail"].startswith("sync_weights"):
            duration_s = float(event["detail"].rsplit(" ", 1)[1].rstrip("s"))
            for replica_id in rows:
                if replica_id in event["detail"]:
                    # A sync can start before the first recorded event (a worker still booting).
                    rows[replica_id].append((max(0.0, event["t"] - duration_s), event["t"], "sync"))
    for replica_id in rows:
        if replica_id.startswith("hybrid"):
            rows[replica_id] += train  # hybrids sleep while their GPUs train
    rows["trainer"] = train
    return rows


def _replica_states(events: list[dict[str, Any]]) -> dict[str, list[Interval]]:
    rows: dict[str, list[Interval]] = {}
    since: dict[str, tuple[float, str]] = {}
    for event in (e for e in events if e["kind"] == "replica_state"):
        subject = event["subject"]
        if subject in since:
            rows[subject].append((since[subject][0], event["t"], since[subject][1]))
        rows.setdefault(subject, [])
        since[subject] = (event["t"], _STATE_CATEGORY.get(event["detail"].split()[0], "idle"))
    for subject, (start, category) in since.items():
        rows[subject].append((start, events[-1]["t"], category))
    for intervals in rows.values():  # from the job's start to the first event: booting, loading weights
        if intervals and intervals[0][0] > 0:
            intervals.insert(0, (0.0, intervals[0][0], "idle"))
    return rows


def _train_intervals(events: list[dict[str, Any]]) -> list[Interval]:
    intervals, started = [], None
    for event in (e for e in events if e["kind"] == "phase" and e["subject"] == "trainer"):
        if event["detail"].startswith("train_start"):
            started = event["t"]
        elif event["detail"].startswith("train_end") and started is not None:
            intervals.append((started, event["t"], "train"))
            started = None
    return intervals
