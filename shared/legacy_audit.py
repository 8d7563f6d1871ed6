"""Temporary: types the audit texts that the trainer and the controller still write, at the writer.

Where it sits: `Bus.audit(kind, subject, detail)` (deprecated) sends its event
through `typed`, so every AuditEvent on the stream carries typed fields and no
reader parses `detail`. Delete this module, and `Bus.audit`, once
`services/trainer/` and `services/controller/` build typed events and call
`Bus.record` (branch `proto`'s report lists the calls).

The texts, as those services write them today:
  phase   trainer     "train_start 3" / "train_end 3"
  phase   controller  "run done"
  switch  controller  "activated" / "deactivated"
  command controller  "sync_weights ('standalone_0', 'standalone_1') 0.012s"  (no ids: "rebalance  0.1s")
  push    controller  "gloo ['hybrid_0'] ok 0.500s" / "gloo ['hybrid_0'] failed: ValueError: x 0.1s"
"""

from __future__ import annotations

import re
from typing import Any

from shared.schema import AuditEvent, AuditKind, AuditPhase

_QUOTED = re.compile(r"'([^']*)'")
_PUSH = re.compile(r"^(?P<transport>\S+) \[(?P<ids>[^\]]*)\] (?P<result>.*) (?P<duration>[\d.]+)s$")


def typed(*, kind: str, subject: str, detail: str, version: int, t: float) -> AuditEvent:
    """The typed event that `detail` describes (only the base fields when the text is not recognised:
    an audit record must never fail the operation it records)."""
    audit_kind = AuditKind(kind)
    try:
        fields = _fields(audit_kind, detail)
    except ValueError:
        fields = {}
    return AuditEvent(kind=audit_kind, subject=subject, detail=detail, version=version, t=t, **fields)


def _fields(kind: AuditKind, detail: str) -> dict[str, Any]:
    words = detail.split()
    if kind is AuditKind.PHASE and len(words) == 2 and words[0] in set(AuditPhase):
        return {"phase": AuditPhase(words[0]), "global_steps": int(words[1])}
    if kind is AuditKind.PHASE and detail == "run done":
        return {"phase": AuditPhase.RUN_DONE}
    if kind is AuditKind.SWITCH:
        return {"activated": detail == "activated"}
    if kind is AuditKind.COMMAND and len(words) >= 2:
        return {"command": words[0], "replica_ids": _QUOTED.findall(detail),
                "duration_s": float(words[-1].removesuffix("s"))}
    if kind is AuditKind.PUSH and (match := _PUSH.match(detail)):
        result = match["result"]
        return {"transport": match["transport"], "replica_ids": _QUOTED.findall(match["ids"]),
                "ok": result == "ok", "error": result.removeprefix("failed: ") if result != "ok" else "",
                "duration_s": float(match["duration"])}
    return {}
