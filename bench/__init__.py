"""Benchmarks: each module runs standalone (``python -m bench.<name> --out FILE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_result(out: Path | None, result: dict[str, Any]) -> None:
    """Save a bench's JSON result where `--out` asked (nothing when it was not given)."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` arguments as dotted config keys and their YAML values."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants KEY=VALUE, got {item!r}")
        changes[key] = yaml.safe_load(value)
    return changes
