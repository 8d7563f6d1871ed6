"""How long a hung service stalls a run under the launcher (docs/reliability.md, "A hung service").

One sim run per argument (256 samples, `time_scale` 0.02, `run.hung_grace_s` 1.0), as
tests/test_faults_hung.py runs it: after 4 micro-steps the named service is SIGSTOPped ("none":
nothing is; "redis": the launcher's embedded Redis, killed once it has answered no PING for
`launcher.redis_hung_after_s`); prints, per run, when the launcher SIGKILLed it (seconds after the
SIGSTOP), the run's wall time and lost/duplicated.

    PYTHONPATH=. python -m bench.hung_service none loadbalancer rollouter redis
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.chaos import REDIS
from bench.live_run import live_config, wait_for
from services import launcher
from shared.names import RunStatus


def one_run(service: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hung_service"))
    config = live_config(tmp, time_scale=0.02, total_rollout_steps=256, run={"hung_grace_s": 1.0})
    with launcher.Job(config_path=config, out_dir=tmp / "run") as job:
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        result: dict[str, Any] = {"stopped": service, "stopped_at_s": round(job.elapsed_s, 2)}
        stopped_s = time.monotonic()
        if service:
            os.kill(hung_pid(job, service), signal.SIGSTOP)
        killed_after_s = None
        while job.poll() is not RunStatus.DONE:
            if service and killed_after_s is None and hung_kills(job, service):
                killed_after_s = round(time.monotonic() - stopped_s, 2)
            time.sleep(launcher.POLL_INTERVAL_S)
        summary = job.summary(wall_time_s=job.elapsed_s, admin={})
    return {**result, "killed_after_stop_s": killed_after_s, "wall_time_s": summary["wall_time_s"],
            "lost": summary["samples"][launcher.LOST], "duplicated": summary["samples"][launcher.DUPLICATED],
            "hung_kills": summary["hung_kills"], "redis_hung_kills": summary["redis_hung_kills"],
            "restarts": summary["restarts"], "out": str(tmp)}


def hung_pid(job: launcher.Job, target: str) -> int:
    if target == REDIS:
        assert job.embedded is not None and job.embedded.proc is not None
        return job.embedded.proc.pid
    return job.procs[target].pid


def hung_kills(job: launcher.Job, target: str) -> int:
    if target == REDIS:
        assert job.embedded is not None
        return job.embedded.hung_kills
    return job.hung_kills[target]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("services", nargs="*", default=["none", "loadbalancer", "rollouter"],
                        help="one run per name: a launcher service to SIGSTOP, redis, or none")
    for service in parser.parse_args(argv).services:
        print(json.dumps(one_run(None if service == "none" else service)), flush=True)


if __name__ == "__main__":
    main()
