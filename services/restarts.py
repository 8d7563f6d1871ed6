"""The launcher's restart policy for a crashed service, as compose's `restart: unless-stopped` would.

Where it sits: services/launcher.py keeps one `RestartBudget` per child process. A child that exits
non-zero (a crash, a SIGKILL, a Redis outage longer than `run.redis_retry_window_s`) is started
again after a backoff that doubles with each restart in the last minute (`BASE_DELAY_S` .. `MAX_DELAY_S`).
More than `max_per_minute` restarts within a minute and the budget says no: the run fails, naming
the service and its log. Every service keeps its state in Redis, so a restarted one resumes. Pure: the
caller passes the clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0
BASE_DELAY_S = 0.25
MAX_DELAY_S = 8.0


@dataclass
class RestartBudget:
    """Restarts of one service within the last `WINDOW_S`; `max_per_minute = 0`: never restart."""

    max_per_minute: int
    restarts_s: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.max_per_minute < 0:
            raise ValueError(f"max_per_minute must be >= 0, got {self.max_per_minute}")

    @property
    def recent(self) -> int:
        """Restarts counted in the window at the last `take`."""
        return len(self.restarts_s)

    def take(self, now_s: float) -> float | None:
        """Spend one restart at `now_s`: the delay before it, or None when the budget is spent."""
        while self.restarts_s and now_s - self.restarts_s[0] >= WINDOW_S:
            self.restarts_s.popleft()
        if len(self.restarts_s) >= self.max_per_minute:
            return None
        delay_s = min(MAX_DELAY_S, BASE_DELAY_S * 2 ** len(self.restarts_s))
        self.restarts_s.append(now_s + delay_s)
        return delay_s
