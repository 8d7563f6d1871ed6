"""Temporary (delete with shared/legacy_audit.py): the texts the trainer and the controller still
write become typed audit fields, and an unrecognised text never fails the operation it records."""

from __future__ import annotations

import pytest

from shared.legacy_audit import typed
from shared.schema import AuditKind, AuditPhase


@pytest.mark.parametrize(("kind", "detail", "expected"), [
    (AuditKind.PHASE, "train_start 3", {"phase": AuditPhase.TRAIN_START, "global_steps": 3}),
    (AuditKind.PHASE, "train_end 3", {"phase": AuditPhase.TRAIN_END, "global_steps": 3}),
    (AuditKind.PHASE, "run done", {"phase": AuditPhase.RUN_DONE}),
    (AuditKind.SWITCH, "activated", {"activated": True}),
    (AuditKind.SWITCH, "deactivated", {"activated": False}),
    (AuditKind.COMMAND, "sync_weights ('standalone_0', 'standalone_1') 0.012s",
     {"command": "sync_weights", "replica_ids": ["standalone_0", "standalone_1"], "duration_s": 0.012}),
    (AuditKind.COMMAND, "rebalance  0.100s", {"command": "rebalance", "replica_ids": [], "duration_s": 0.1}),
    (AuditKind.PUSH, "gloo ['hybrid_0'] ok 0.500s",
     {"transport": "gloo", "replica_ids": ["hybrid_0"], "ok": True, "error": "", "duration_s": 0.5}),
    (AuditKind.PUSH, "gloo ['hybrid_0'] failed: ValueError: no push 0.100s",
     {"transport": "gloo", "ok": False, "error": "ValueError: no push", "duration_s": 0.1}),
    (AuditKind.COMMAND, "some new text", {"command": "", "duration_s": None}),
])
def test_a_legacy_text_becomes_typed_fields(kind, detail, expected):
    event = typed(kind=kind, subject="controller", detail=detail, version=2, t=1.0)
    assert event.kind is kind and event.detail == detail and event.version == 2
    assert {name: getattr(event, name) for name in expected} == expected
