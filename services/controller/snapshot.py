"""The controller's crash-safety snapshot: the core's state and the trainer event handled last.

Where it sits: the controller service writes it to `Names.controller_state` after
every decision (before the decision's commands run) and reads it back when it
restarts. The snapshot names its format; one written by another format (e.g. the
one before the orchestration moved to `core/`, whose `last_event` was a dict with
a `status`) is refused with a ValueError that says what to do, never half-read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgpack

from shared.schema import TrainerAction, TrainerEvent, TrainerPhase, TrainerReply

SNAPSHOT_FORMAT = 2
"""1: the seed's (no `format` key; `last_event` a dict with a `status`). 2: `last_event` a HandledEvent."""


@dataclass(kw_only=True)
class HandledEvent:
    """The trainer event handled last (persisted with the core): a replay of it after a restart
    finishes it (`finished` False) or only re-sends its reply."""

    phase: TrainerPhase
    global_steps: int
    finished: bool = False
    reply: dict[str, Any] = field(default_factory=dict)
    """The TrainerReply sent, as plain data ({} when the phase gets none)."""

    def matches(self, event: TrainerEvent) -> bool:
        return (self.phase, self.global_steps) == (event.phase, event.global_steps)

    def saved_reply(self) -> TrainerReply | None:
        data = self.reply
        return TrainerReply(**{**data, "action": TrainerAction(data["action"])}) if data else None


def dump_snapshot(core_state: dict[str, Any], last_event: HandledEvent | None) -> bytes:
    state = {"format": SNAPSHOT_FORMAT, "core": core_state,
             "last_event": dataclasses.asdict(last_event) if last_event else None}
    packed: bytes = msgpack.packb(state, use_bin_type=True)
    return packed


def load_snapshot(raw: bytes | str, *, key: str) -> tuple[dict[str, Any], HandledEvent | None]:
    """(the core's state, the last handled event) from `dump_snapshot`'s bytes; ValueError naming
    `key` when they are not a snapshot of this format."""
    try:
        saved = msgpack.unpackb(raw, raw=False)
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"{key} is not a controller snapshot ({type(exc).__name__}: {exc}); "
                         f"{_WHAT_TO_DO}") from exc
    found = saved.get("format", 1) if isinstance(saved, dict) else None
    if found != SNAPSHOT_FORMAT:
        raise ValueError(f"{key} holds a controller snapshot of format {found}, this controller reads "
                         f"format {SNAPSHOT_FORMAT} only (a run started by an earlier version); "
                         f"{_WHAT_TO_DO}")
    last = saved["last_event"]
    try:
        event = HandledEvent(**{**last, "phase": TrainerPhase(last["phase"])}) if last else None
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"{key}: unreadable last_event {last!r} ({exc}); {_WHAT_TO_DO}") from exc
    return saved["core"], event


_WHAT_TO_DO = ("finish that run with the version that started it, or start it afresh "
               "(`dynsched run --fresh` deletes the run's keys)")
