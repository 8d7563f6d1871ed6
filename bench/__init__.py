"""Benchmarks: each module runs standalone (``python -m bench.<name> --out FILE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(out: Path | None, result: dict[str, Any]) -> None:
    """Save a bench's JSON result where `--out` asked (nothing when it was not given)."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
