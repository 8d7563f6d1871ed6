"""What every gpu_check step shares: its result record, the pass rule, and its process entry point.

A step module has `run(args) -> Result` and ends with `main(run, add_args)`; the runner
(`__main__`) starts it as `python -m bench.gpu_check.<step> --result FILE [--dry-run] ...` under the
step's timeout, so a step that hangs (an NCCL peer, a CUDA context) cannot stall the others.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Result:
    """One step's outcome. `status` is `pass` when every check holds, `fail` when one does not,
    `skip` (with `reason`) when this host cannot run it; `timeout` and `error` come from the runner."""

    step: str
    status: str = PASS
    reason: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    """Each pass condition by name: the step passes only if all are true."""
    data: dict[str, Any] = field(default_factory=dict)
    """Measurements (bytes, seconds, versions) behind the checks."""
    seconds: float = 0.0

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        if not ok and self.status == PASS:
            self.status = FAIL
        return bool(ok)

    def skip(self, reason: str) -> Result:
        self.status, self.reason = SKIP, reason
        return self


def cuda_or_reason() -> str:
    """'' when torch sees a CUDA GPU, else why not (the step is then skipped)."""
    try:
        import torch
    except ImportError as exc:
        return f"torch not importable: {exc}"
    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda})"
    return ""


def gib(num_bytes: float) -> float:
    return round(num_bytes / 2**30, 3)


def main(step: str, run: Callable[[argparse.Namespace, Result], Result | None],
         add_args: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m bench.gpu_check.{step}")
    parser.add_argument("--result", required=True, help="where to write this step's JSON result")
    parser.add_argument("--dry-run", action="store_true", help="CPU: run what needs no GPU, skip the rest")
    if add_args is not None:
        add_args(parser)
    args = parser.parse_args()
    result = Result(step=step)
    started = time.monotonic()
    try:
        result = run(args, result) or result
    except Exception as exc:  # the step's own failure, recorded; the runner goes on with the next
        result.status, result.reason = FAIL, f"{type(exc).__name__}: {exc}"
        result.data["traceback"] = traceback.format_exc()[-4000:]
    result.seconds = round(time.monotonic() - started, 3)
    Path(args.result).write_text(json.dumps(asdict(result), indent=1, default=str) + "\n")
