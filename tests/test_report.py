"""The run report's timeline is rebuilt correctly from the audit events' typed fields."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from core.controller import SyncWeights
from services.report import timeline, write_report
from shared.schema import AuditEvent, AuditKind, AuditPhase, CommandAction, ReplicaState


def event(t: float, kind: AuditKind, subject: str, **typed: Any) -> AuditEvent:
    return AuditEvent(t=t, kind=kind, subject=subject, detail="free text, never parsed", **typed)


def replica(t: float, replica_id: str, state: ReplicaState,
            action: CommandAction | None = None) -> AuditEvent:
    return event(t, AuditKind.REPLICA_STATE, replica_id, state=state, action=action)


def trainer(t: float, phase: AuditPhase) -> AuditEvent:
    return event(t, AuditKind.PHASE, "trainer", phase=phase, global_steps=1)


def test_replica_states_trainer_phases_and_syncs_become_intervals():
    events = [
        replica(0.0, "hybrid_0", ReplicaState.SLEEPING),
        replica(1.0, "hybrid_0", ReplicaState.PAUSED, CommandAction.WAKE),
        event(1.5, AuditKind.COMMAND, "controller", command=SyncWeights.kind, replica_ids=["hybrid_0"],
              duration_s=0.5),
        replica(2.0, "hybrid_0", ReplicaState.SERVING, CommandAction.RESUME),
        replica(3.0, "hybrid_0", ReplicaState.SLEEPING, CommandAction.SLEEP),
        trainer(3.5, AuditPhase.TRAIN_START),
        trainer(4.0, AuditPhase.TRAIN_END),
    ]
    rows = timeline(events)
    assert rows["trainer"] == [(3.5, 4.0, "train")]
    hybrid = sorted(rows["hybrid_0"])
    assert (0.0, 1.0, "idle") in hybrid
    assert (1.0, 1.5, "sync") in hybrid
    assert (2.0, 3.0, "rollout") in hybrid
    assert (3.5, 4.0, "train") in hybrid


def test_a_sync_marks_only_the_replicas_it_names():
    events = [replica(0.0, "hybrid_1", ReplicaState.SERVING), replica(0.0, "hybrid_10", ReplicaState.SERVING),
              event(1.0, AuditKind.COMMAND, "controller", command=SyncWeights.kind, replica_ids=["hybrid_10"],
                    duration_s=0.5)]
    rows = timeline(events)
    assert (0.5, 1.0, "sync") in rows["hybrid_10"] and all(c != "sync" for _, _, c in rows["hybrid_1"])


def test_write_report_draws_both_charts(tmp_path):
    (tmp_path / "audit.jsonl").write_text("\n".join(json.dumps({"id": "1-0",
                                                                **dataclasses.asdict(e)}) for e in [
        replica(0.0, "standalone_0", ReplicaState.SERVING),
        trainer(1.0, AuditPhase.TRAIN_START),
        trainer(2.0, AuditPhase.TRAIN_END),
    ]))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"version": 1, "training/reward_mean": 0.5}))
    written = write_report(tmp_path)
    assert [p.name for p in written] == ["resource_time.png", "reward_curve.png"]
    assert all(p.stat().st_size > 1000 for p in written)
