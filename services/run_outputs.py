"""What a finished (or failed) run leaves behind, read back from Redis and written to its output folder.

Where it sits: `services/launcher.py` calls `write_outputs` when a run ends;
`dynsched` commands and tests read a run's hashes and streams through these
helpers. Only Redis and the controller's admin API are read; nothing here
starts or stops a process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterator
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
    start = "-"
    while True:
        entries: Any = client.xrange(stream, min=start, max="+", count=batch)
        if not entries:
            return
        for entry_id, fields in entries:
            try:
                yield text(entry_id), schema.decode(fields)
            except schema.MalformedMessage as exc:
                log.warning("skipping malformed entry %s on %s: %s", text(entry_id), stream, exc)
        start = "(" + text(entries[-1][0])


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


def write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    lines = [json.dumps(row) + "\n" for row in rows]
    path.write_text("".join(lines))
    return len(lines)


def write_outputs(client: redis.Redis, names: Names, out_dir: Path, summary: dict[str, Any]) -> None:
    """`metrics.jsonl` (seed metric names as keys), `audit.jsonl` and `summary.json` under `out_dir`."""
    metrics = (
        {"version": m.version, "global_steps": m.global_steps, "t": m.t, **m.metrics}
        for _, m in read_stream(client, names.metrics) if isinstance(m, schema.CycleMetrics))
    audit = ({"id": entry_id, **dataclasses.asdict(e)}
             for entry_id, e in read_stream(client, names.audit) if isinstance(e, schema.AuditEvent))
    summary["num_cycles"] = write_jsonl(out_dir / "metrics.jsonl", metrics)
    summary["num_audit_events"] = write_jsonl(out_dir / "audit.jsonl", audit)
    started_at = float(summary["started_at"]) if summary.get("started_at") else None
    summary["charts"] = [p.name for p in write_report(out_dir, started_at=started_at)]
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
