"""A real sim run for tests that watch it from outside (Prometheus, a browser): every service its own
process (services/launcher.py), slowed down so there is time to look, its admin API on a free port.
Its config is bench/live_run.py's (the chaos and hung-service benches run the same)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.live_run import live_config
from services import launcher


@contextmanager
def live_run(tmp_path: Path, **config: Any) -> Iterator[tuple[launcher.Job, str]]:
    """(the running job, its admin "host:port"); every process is stopped on leaving."""
    with launcher.Job(config_path=live_config(tmp_path, **config), out_dir=tmp_path / "run") as job:
        deadline_s = time.monotonic() + 60
        while not (address := launcher.admin_address(job.redis, job.names)):
            assert time.monotonic() < deadline_s, "the controller did not publish its admin address"
            job.poll()
            time.sleep(0.1)
        yield job, address
