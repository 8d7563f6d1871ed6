"""The run report's timeline is rebuilt correctly from audit events."""

from __future__ import annotations

import json

from services.report import timeline, write_report


def event(t: float, kind: str, subject: str, detail: str) -> dict[str, object]:
    return {"t": t, "kind": kind, "subject": subject, "detail": detail}


def test_replica_states_trainer_phases_and_syncs_become_intervals():
    events = [
        event(0.0, "replica_state", "hybrid_0", "sleeping (started)"),
        event(1.0, "replica_state", "hybrid_0", "paused (wake)"),
        event(1.5, "command", "controller", "sync_weights ('hybrid_0',) 0.500s"),
        event(2.0, "replica_state", "hybrid_0", "serving (resume)"),
        event(3.0, "replica_state", "hybrid_0", "sleeping (sleep)"),
        event(3.5, "phase", "trainer", "train_start 1"),
        event(4.0, "phase", "trainer", "train_end 1"),
    ]
    rows = timeline(events)
    assert rows["trainer"] == [(3.5, 4.0, "train")]
    hybrid = sorted(rows["hybrid_0"])
    assert (0.0, 1.0, "idle") in hybrid
    assert (1.0, 1.5, "sync") in hybrid
    assert (2.0, 3.0, "rollout") in hybrid
    assert (3.5, 4.0, "train") in hybrid


def test_write_report_draws_both_charts(tmp_path):
    (tmp_path / "audit.jsonl").write_text("\n".join(json.dumps(e) for e in [
        event(0.0, "replica_state", "standalone_0", "serving (started)"),
        event(1.0, "phase", "trainer", "train_start 1"),
        event(2.0, "phase", "trainer", "train_end 1"),
    ]))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"version": 1, "training/reward_mean": 0.5}))
    written = write_report(tmp_path)
    assert [p.name for p in written] == ["resource_time.png", "reward_curve.png"]
    assert all(p.stat().st_size > 1000 for p in written)
