"""Progress of a run for `dynsched run`: a tqdm bar on a terminal, else one plain line every few seconds.

Where it sits: services/launcher.py's `run_job` reports completed micro-steps here while it waits for
the run. Off a terminal (output redirected to a file, CI) tqdm draws nothing, and a long run would
show no sign of life, so a line like `real_small: micro-step 12/48 (25%), 41 s` is printed instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

PLAIN_INTERVAL_S = 5.0


class Progress:
    """`update(done)` with the number of completed micro-steps; `close()` prints the final state."""

    def __init__(self, *, total: int, desc: str, enabled: bool = True, stream: TextIO | None = None,
                 interval_s: float = PLAIN_INTERVAL_S) -> None:
        self.total, self.desc, self.stream = total, desc, stream or sys.stderr
        self.interval_s = interval_s
        self.done = 0
        self._started_s = self._printed_s = time.monotonic()
        self._bar: Any = None
        self._plain = enabled and not self.stream.isatty()
        if enabled and not self._plain:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="step", desc=desc, file=self.stream)

    def update(self, done: int) -> None:
        done = min(done, self.total)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif self._plain and time.monotonic() - self._printed_s >= self.interval_s:
            self._print(done)
        self.done = done

    def _print(self, done: int) -> None:
        self._printed_s = time.monotonic()
        share = done / self.total if self.total else 1.0
        print(f"{self.desc}: micro-step {done}/{self.total} ({share:.0%}), "
              f"{self._printed_s - self._started_s:.0f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._plain:
            self._print(self.done)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
