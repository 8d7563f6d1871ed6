"""What a finished (or failed) run leaves behind, read back from Redis and written to its output folder.

Where it sits: `services/launcher.py` drains the audit and metrics streams into their JSONL
files while a run goes (`StreamExport`: those streams are capped) and calls `write_outputs` when
it ends;
`dynsched` commands and tests read a run's hashes and streams through these
helpers. Only Redis and the controller's admin API are read; nothing here
starts or stops a process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from services.report import write_report
from shared import schema
from shared.bus import text
from shared.names import AccountingField, Names, SampleState

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 5.0
LOST = "lost"
"""summary.json's `samples` key for fed samples with no state in the per-sample hash (must be 0)."""
DUPLICATED = "duplicated"
"""summary.json's `samples` key for trainings beyond one per sample (must be 0)."""


def read_hash(client: redis.Redis, key: str) -> dict[str, str]:
    return {text(k): text(v) for k, v in client.hgetall(key).items()}  # type: ignore[union-attr]


def read_stream(client: redis.Redis, stream: str, *,
                batch: int = 1000) -> Iterator[tuple[str, schema.Message]]:
    """Every entry of `stream`, decoded, oldest first; malformed entries are logged and skipped."""
    return ((entry_id, message) for entry_id, message in _entries(client, stream, after=None, batch=batch)
            if message is not None)


def _entries(client: redis.Redis, stream: str, *, after: str | None,
             batch: int = 1000) -> Iterator[tuple[str, schema.Message | None]]:
    """The entries of `stream` after the id `after` (None: all), oldest first, decoded; None for a
    malformed one (logged)."""
    start = "-" if after is None else "(" + after
    while True:
        entries: Any = client.xrange(stream, min=start, max="+", count=batch)
        if not entries:
            return
        for entry_id, fields in entries:
            try:
                yield text(entry_id), schema.decode(fields)
            except schema.MalformedMessage as exc:
                log.warning("skipping malformed entry %s on %s: %s", text(entry_id), stream, exc)
                yield text(entry_id), None
        start = "(" + text(entries[-1][0])


Row = Callable[[str, schema.Message], dict[str, Any] | None]
"""An entry (id, message) as a JSONL row; None leaves it out."""


class StreamExport:
    """One stream appended to a JSONL file as its entries come (`drain`), each entry once, in order:
    the stream is capped (run.event_stream_maxlen), the file keeps the whole run. An entry trimmed
    before a drain reached it is counted in `missed` (logged), from XINFO STREAM's counters: the
    entries ever added less those still there are the entries trimmed, all older than the first
    one there. Redis before 7.0 has no such counter: `trims_counted` is then False (logged once), and
    the summary says the count is unknown instead of reporting 0."""

    def __init__(self, stream: str, path: Path, row: Row) -> None:
        self.stream = stream
        self.path = path
        self.row = row
        self.last_id: str | None = None
        self.rows = 0
        self.missed = 0
        self.trims_counted = True
        """False when the server cannot count trimmed entries (Redis < 7.0: no XINFO entries-added)."""
        self._read = 0
        path.write_text("")

    def drain(self, client: redis.Redis) -> int:
        """Append what was added since the last drain; the rows written so far."""
        try:
            info: Any = client.xinfo_stream(self.stream)
        except redis.ResponseError:  # no such stream (yet)
            return self.rows
        if "entries-added" not in info and self.trims_counted:
            self.trims_counted = False
            log.warning("Redis before 7.0: entries of %s trimmed before %s got them cannot be counted "
                        "(no XINFO entries-added); the summary says so", self.stream, self.path)
        trimmed = int(info.get("entries-added", 0)) - int(info["length"])
        if self.trims_counted and (missed := trimmed - self._read - self.missed) > 0:
            log.warning("%d entries of %s were trimmed before %s got them (run.event_stream_maxlen)",
                        missed, self.stream, self.path)
            self.missed += missed
        lines = []
        for entry_id, message in _entries(client, self.stream, after=self.last_id):
            self.last_id = entry_id
            self._read += 1
            if message is not None and (row := self.row(entry_id, message)) is not None:
                lines.append(json.dumps(row) + "\n")
        with self.path.open("a") as file:
            file.write("".join(lines))
        self.rows += len(lines)
        return self.rows


def run_exports(names: Names, out_dir: Path) -> dict[str, StreamExport]:
    """`metrics.jsonl` (seed metric names as keys) and `audit.jsonl`, started empty."""
    return {"metrics": StreamExport(names.metrics, out_dir / "metrics.jsonl", _cycle_row),
            "audit": StreamExport(names.audit, out_dir / "audit.jsonl", _audit_row)}


def _cycle_row(entry_id: str, m: schema.Message) -> dict[str, Any] | None:
    if not isinstance(m, schema.CycleMetrics):
        return None
    return {"version": m.version, "global_steps": m.global_steps, "t": m.t, **m.metrics}


def _audit_row(entry_id: str, e: schema.Message) -> dict[str, Any] | None:
    return {"id": entry_id, **dataclasses.asdict(e)} if isinstance(e, schema.AuditEvent) else None


def admin_address(client: redis.Redis, names: Names) -> str | None:
    value = client.get(names.controller_admin)
    return text(value) if value else None


def fetch_admin_status(address: str | None) -> dict[str, Any]:
    """`GET /status` of the controller, or {} (logged) when it cannot be reached."""
    if not address:
        log.warning("no controller admin address in Redis; summary lacks the controller's view")
        return {}
    try:
        response = httpx.get(f"http://{address}/status", timeout=ADMIN_TIMEOUT_S)
        response.raise_for_status()
        return dict(response.json())
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("GET http://%s/status failed: %s", address, exc)
        return {}


def sample_counts(accounting: dict[str, str], states: dict[str, str]) -> dict[str, int]:
    """Per-state counts from the per-sample `states` hash (sample id -> SampleState), `fed` from the
    accounting hash; `lost` = fed - samples with a state; `duplicated` = trainings the accounting
    counted - samples in state trained (0: nothing trained twice)."""
    counts = {str(name): int(float(accounting.get(name, 0))) for name in AccountingField}
    trained_by_counter = counts[AccountingField.TRAINED]
    by_state = Counter(states.values())
    for state in SampleState:
        counts[str(state)] = by_state[state]
    counts[LOST] = counts[AccountingField.FED] - sum(by_state[state] for state in SampleState)
    counts[DUPLICATED] = trained_by_counter - by_state[SampleState.TRAINED]
    return counts


def write_outputs(client: redis.Redis, names: Names, out_dir: Path, summary: dict[str, Any],
                  exports: dict[str, StreamExport] | None = None) -> None:
    """`metrics.jsonl`, `audit.jsonl` (the rest of `exports`, the launcher's, or the whole streams
    when None) and `summary.json` under `out_dir`."""
    exports = run_exports(names, out_dir) if exports is None else exports
    summary["num_cycles"] = exports["metrics"].drain(client)
    summary["num_audit_events"] = exports["audit"].drain(client)
    if missed := {name: export.missed for name, export in exports.items() if export.missed}:
        summary["trimmed_before_export"] = missed
    if uncounted := sorted(name for name, export in exports.items() if not export.trims_counted):
        summary["trimmed_before_export_uncounted"] = uncounted  # Redis < 7.0: the count is unknown, not 0
    started_at = float(summary["started_at"]) if summary.get("started_at") else None
    summary["charts"] = [p.name for p in write_report(out_dir, started_at=started_at)]
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
