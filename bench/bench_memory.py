"""Redis memory of a long sim run: `used_memory` per 1,000 trained samples, trimmed and not.

Where it sits: issue 12 finding 9. Runs `configs/sim_small.yaml` through the launcher (every
service its own process, the launcher's own Redis) for `--samples` prompts, once with
`run.stream_retention_s = --retention-s` and once with trimming pushed out of reach (a retention
longer than the run), and samples Redis's `INFO memory` each time another 1,000 samples are trained.
With trimming, memory stays flat after the first thousand (what grows is the per-sample state hash,
a few dozen bytes a sample); without it, it grows with every sample. The streams no group reads
(audit, metrics, controller:acks) are capped by length instead (`run.event_stream_maxlen`, 20,000
by default) and stay below it here: a 1,024-prompt `launcher.run_job` of sim_small at time_scale
0.005 left 718 audit entries, 16 metrics entries (one per weight version) and 488 acks, so some
3,500 audit entries for the default 5,000 prompts.

Run: ``python -m bench.bench_memory --out runs/bench_memory.json`` (about 3 minutes here).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from services import launcher
from shared.names import AccountingField, RunStatus

PROJECT_ROOT = Path(__file__).resolve().parent.parent
NO_TRIM_S = 1e9
STEP = 1000


def run_once(*, samples: int, time_scale: float, retention_s: float, workdir: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "configs" / "sim_small.yaml").read_text())
    data["run"].update(time_scale=time_scale, stream_retention_s=retention_s, namespace="bench_memory")
    data["data"]["total_rollout_steps"] = samples
    config_path = workdir / f"config-{retention_s:g}.yaml"
    config_path.write_text(yaml.safe_dump(data))
    rows: list[dict[str, Any]] = []
    started_s = time.monotonic()
    with launcher.Job(config_path=config_path, out_dir=workdir / f"run-{retention_s:g}") as job:
        next_mark = STEP
        while True:
            status = job.poll()
            trained = int(job.read(job.names.accounting).get(AccountingField.TRAINED, 0))
            if trained >= next_mark or status is RunStatus.DONE:
                memory: Any = job.redis.info("memory")
                rows.append({"trained": trained, "used_memory_mb": round(memory["used_memory"] / 2**20, 2),
                             "mq_entries": int(job.redis.xlen(job.names.mq)),
                             "lb_results_entries": int(job.redis.xlen(job.names.lb_results))})
                print(f"retention {retention_s:g}s: {rows[-1]}", flush=True)
                next_mark = trained // STEP * STEP + STEP
            if status is RunStatus.DONE:
                break
            time.sleep(0.2)
    return {"retention_s": retention_s, "wall_s": round(time.monotonic() - started_s, 1), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--time-scale", type=float, default=0.005)
    parser.add_argument("--retention-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        results = [run_once(samples=args.samples, time_scale=args.time_scale, retention_s=retention_s,
                            workdir=Path(tmp)) for retention_s in (args.retention_s, NO_TRIM_S)]
    print(f"{'trained':>8} {'trimmed MB':>11} {'untrimmed MB':>13}")
    for trimmed, untrimmed in zip(results[0]["rows"], results[1]["rows"], strict=False):
        print(f"{trimmed['trained']:>8} {trimmed['used_memory_mb']:>11} {untrimmed['used_memory_mb']:>13}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"samples": args.samples, "time_scale": args.time_scale,
                                        "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
