"""The launcher's restart policy for a crashed service, as compose's `restart: unless-stopped` would.

Where it sits: services/launcher.py keeps one `RestartBudget` per child process. A child that exits
non-zero (a crash, a SIGKILL, a Redis outage longer than `run.redis_retry_window_s`) is started
again after a backoff that doubles with each restart in the last minute (`BASE_DELAY_S` .. `MAX_DELAY_S`).
More than `max_per_minute` restarts within a minute and the budget says no: the run fails, naming
the service and its log. Every service keeps its state in Redis, so a restarted one resumes.

A child that hangs (SIGSTOP, a deadlocked event loop, a loop stuck in a C call) never exits; `HangWatch`
says when to SIGKILL it so that the same path restarts it: its health report (`shared.health.judge`)
has been bad for longer than a grace period, counted from its first report, so a slow start-up is
never judged. Pure: the caller passes the clock and the health judgement.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shared.names import HEALTH_TTL_S

WINDOW_S = 60.0
BASE_DELAY_S = 0.25
MAX_DELAY_S = 8.0
BLIND_S = float(HEALTH_TTL_S)
"""A watcher that has not looked for this long (its Redis calls blocked in an outage, during which
every health key expires) starts its grace periods afresh: it judges only what it saw."""


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


@dataclass
class HangWatch:
    """Whether one running child is hung, from its health reports as the launcher polls them."""

    grace_s: float
    reported: bool = False
    """The child has published a health report since it started (judged only from then on)."""
    bad_since_s: float | None = None
    looked_s: float | None = None

    def __post_init__(self) -> None:
        if not self.grace_s > 0:
            raise ValueError(f"grace_s must be > 0, got {self.grace_s}")

    def hung(self, *, now_s: float, present: bool, problem: str) -> bool:
        """Look once: `present` says the health key exists, `problem` is its judgement ('' healthy).
        True when the report has been bad for longer than `grace_s` since the child first reported."""
        blind = self.looked_s is not None and now_s - self.looked_s > BLIND_S
        self.looked_s = now_s
        self.reported = self.reported or present
        if not problem or not self.reported:
            self.bad_since_s = None
            return False
        if self.bad_since_s is None or blind:
            self.bad_since_s = now_s
        return now_s - self.bad_since_s > self.grace_s
