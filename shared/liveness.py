"""Loop progress: every supervised loop stamps a heartbeat as it goes round; health checks judge it.

Where it sits: `shared.runtime.supervise` runs a service's loops as one task group and names the
loop each task belongs to in a context variable. The waits every loop iteration passes through (a
stream read, `sleep_unless`, a command waiting for its ack) call `beat()`, which stamps the loop
it runs in; a task a loop starts inherits the loop's name. So no loop body has to remember to
stamp: a loop is stale only when it is stuck somewhere that never returns to a wait.

The controller's /healthz reads these stamps directly (`LIVENESS`). Every service also publishes
them to Redis (`shared.health.publish_health`), where `python -m shared.health` judges them for a
compose healthcheck.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

_loop: ContextVar[str | None] = ContextVar("dynsched_loop", default=None)


class Liveness:
    """Monotonic time of each running loop's last beat; a loop that returned is dropped."""

    def __init__(self) -> None:
        self.beats: dict[str, float] = {}

    def enter(self, name: str) -> None:
        """`name` starts running in the current task (and the tasks it starts)."""
        _loop.set(name)
        self.beats[name] = time.monotonic()

    def leave(self, name: str) -> None:
        """`name` returned: a finished loop is not a stale one."""
        self.beats.pop(name, None)

    def stamp(self) -> None:
        name = _loop.get()
        if name is not None and name in self.beats:
            self.beats[name] = time.monotonic()

    def ages(self) -> dict[str, float]:
        """Seconds since each running loop's last beat."""
        beats = dict(self.beats)  # one copy: the stuck-loop watchdog reads this from its own thread
        now = time.monotonic()
        return {name: round(now - at, 3) for name, at in sorted(beats.items())}


LIVENESS = Liveness()
"""This process's loops (one per process; the in-process test stack shares it, names are unique)."""


def current_loop() -> str | None:
    """The supervised loop the caller runs in, if any."""
    return _loop.get()


def untrack() -> None:
    """The calling loop's progress is judged elsewhere (an HTTP server answers its own probes)."""
    name = _loop.get()
    if name is not None:
        LIVENESS.leave(name)


def beat() -> None:
    """Stamp the loop the caller runs in (nothing outside a supervised loop)."""
    LIVENESS.stamp()


def stale_loops(ages: dict[str, float], stale_after_s: float) -> list[str]:
    """The loops whose last beat is older than `stale_after_s`."""
    return sorted(name for name, age in ages.items() if age > stale_after_s)
