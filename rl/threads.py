"""How many torch threads the model build can use: the cores nobody else is using now."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def cpu_jiffies(proc_stat: str) -> tuple[int, int]:
    """Idle (idle + iowait) and total jiffies of all cores together, from the text of /proc/stat
    (its first line: ``cpu user nice system idle iowait irq softirq ...``). ValueError or IndexError
    on text of another shape."""
    fields = [int(v) for v in proc_stat.split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def busy_between(before: tuple[int, int], after: tuple[int, int], cores: int) -> float:
    """Cores kept busy between two `cpu_jiffies` readings: the share of non-idle jiffies times `cores`."""
    (idle0, total0), (idle1, total1) = before, after
    return cores * (1 - (idle1 - idle0) / max(1, total1 - total0))


def threads_for(cores: int, busy: float) -> int:
    """The cores nobody else is using, at least one and at most `cores`."""
    return max(1, min(cores, round(cores - busy)))


def busy_cores(sample_s: float = 1.0) -> float:
    """Cores other processes keep busy now, from /proc/stat over `sample_s` (the load average lags
    by a minute: right after `make install` it still counts the install); the load average where
    /proc/stat is missing."""
    try:
        before = cpu_jiffies(Path("/proc/stat").read_text())
        time.sleep(sample_s)
        after = cpu_jiffies(Path("/proc/stat").read_text())
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]
    return busy_between(before, after, os.cpu_count() or 1)


def build_threads() -> int:
    """torch threads for the warm-up: the cores nobody else is using, at least one. On 2 cores with a
    load average of 11, 2 threads took 8.7 s a step and 1 thread 1.9 s (spinning threads fight the
    other processes); on an idle machine every core helps."""
    cores = os.cpu_count() or 1
    busy = busy_cores()
    threads = threads_for(cores, busy)
    log.info("warm-up on %d torch thread(s) (%d cores, %.1f busy)", threads, cores, busy)
    return threads
