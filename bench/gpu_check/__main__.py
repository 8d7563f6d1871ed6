"""`python -m bench.gpu_check --out DIR [--dry-run] [--steps host,offload,...]`: run every step, write JSON.

Each step runs as its own process (`python -m bench.gpu_check.<module>`) under its own timeout, so
a hung NCCL peer or CUDA context costs that step only. The result is `DIR/gpu_check.json`:
`{"passed": bool, "steps": {name: {"status": pass|fail|skip|timeout|error, "reason", "checks",
"data", "seconds"}}}`; `passed` is true when no step failed, timed out or errored (skips are
listed in `skipped` with their reasons). Exit status 0 when passed. The step timeouts add up to
9 minutes; on an H200 the steps are expected to take about 3 (not yet measured: no GPU run so far).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEPS: dict[str, tuple[str, float]] = {
    "host": ("bench.gpu_check.host", 30.0),
    "offload": ("bench.gpu_check.offload", 150.0),
    "ipc": ("bench.gpu_check.ipc", 60.0),
    "nccl": ("bench.gpu_check.nccl", 90.0),
    "vllm": ("bench.gpu_check.vllm_check", 210.0),
}
"""step -> (module, timeout in seconds)."""


def run_step(name: str, out: Path, dry_run: bool, extra: list[str]) -> dict[str, Any]:
    module, timeout_s = STEPS[name]
    result_path = out / f"{name}.json"
    log_path = out / f"{name}.log"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", module, "--result", str(result_path), *extra]
    cmd += ["--dry-run"] if dry_run else []
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the step and every process it started
            proc.wait()
            return {"step": name, "status": "timeout",
                    "reason": f"over its {timeout_s:.0f}s limit; see {log_path}",
                    "checks": {}, "data": {}, "seconds": round(time.monotonic() - started, 3)}
    if not result_path.exists():
        tail = log_path.read_text()[-2000:]
        return {"step": name, "status": "error", "reason": f"exited {proc.returncode} without a result",
                "checks": {}, "data": {"log_tail": tail}, "seconds": round(time.monotonic() - started, 3)}
    return dict(json.loads(result_path.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json and one log per step")
    parser.add_argument("--dry-run", action="store_true", help="on CPU: run what needs no GPU, skip the rest")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {list(STEPS)}")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {list(STEPS)}")
    steps: dict[str, Any] = {}
    for name in names:
        steps[name] = run_step(name, out, args.dry_run, [])
        print(f"{name:8s} {steps[name]['status']:8s} {steps[name]['seconds']:7.1f}s  {steps[name]['reason']}",
              flush=True)
        failed = [c for c, ok in steps[name].get("checks", {}).items() if not ok]
        if failed:
            print(f"{'':8s} failed checks: {', '.join(failed)}", flush=True)
    summary = {
        "passed": all(s["status"] in ("pass", "skip") for s in steps.values()),
        "dry_run": args.dry_run,
        "skipped": {n: s["reason"] for n, s in steps.items() if s["status"] == "skip"},
        "steps": steps,
    }
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"{'PASSED' if summary['passed'] else 'FAILED'}: {out / 'gpu_check.json'}"
          f" ({len(summary['skipped'])} skipped)", flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
