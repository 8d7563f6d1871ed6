"""Discrete-event engine: a virtual clock, a heap of timed callbacks, and processes.

Where it sits: the bottom of the simulator. ``sim.model`` (replicas) schedules
callbacks on it; ``sim.run`` drives the trainer's cycle (``core.trainer_cycle``) as a
*process*, a generator that yields either a delay in seconds or a ``Signal`` to wait
on, so each operation takes its modelled time, one after another. Nothing ever
sleeps: the clock jumps from event to event.

Determinism: events at the same time run in the order they were scheduled
(a monotonically increasing sequence number breaks ties), so a run is a pure
function of the scenario and its seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from typing import Any

Callback = Callable[..., None]
Process = Generator["float | Signal", None, None]


class Signal:
    """A condition processes wait on; ``fire`` wakes every current waiter (at the current time)."""

    __slots__ = ("_engine", "_waiters", "name")

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine = engine
        self._waiters: list[Process] = []
        self.name = name

    def wait(self, process: Process) -> None:
        self._waiters.append(process)

    def fire(self) -> None:
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        for process in waiters:
            self._engine.after(0.0, self._engine.step_process, process)


class Engine:
    """Virtual clock plus an event heap; ``run`` drains it until ``stop`` or empty."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[tuple[float, int, Callback, tuple[Any, ...]]] = []
        self._seq = 0
        self._stopped = False
        self.events_processed = 0

    def at(self, time_s: float, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` at absolute virtual time ``time_s`` (never in the past)."""
        if time_s < self.now_s:  # rounding only: a float sum may land a hair before now
            assert time_s >= self.now_s - 1e-9, f"event in the past: {time_s} < {self.now_s}"
            time_s = self.now_s
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, callback, args))

    def after(self, delay_s: float, callback: Callback, *args: Any) -> None:
        assert delay_s >= 0.0, f"negative delay {delay_s}"
        self.at(self.now_s + delay_s, callback, *args)

    def signal(self, name: str) -> Signal:
        return Signal(self, name)

    def start_process(self, process: Process) -> None:
        """Start a generator process at the current time."""
        self.after(0.0, self.step_process, process)

    def step_process(self, process: Process) -> None:
        """Advance a process to its next yield and arrange to resume it."""
        try:
            request = next(process)
        except StopIteration:
            return
        if isinstance(request, Signal):
            request.wait(process)
        else:
            self.after(float(request), self.step_process, process)

    def stop(self) -> None:
        """End ``run`` after the current event; pending events are discarded."""
        self._stopped = True

    def run(self, *, max_time_s: float = float("inf")) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and not self._stopped:
            time_s, _, callback, args = pop(heap)
            if time_s > max_time_s:
                raise RuntimeError(f"simulation exceeded max_time_s={max_time_s} (stuck or misconfigured?)")
            self.now_s = time_s
            self.events_processed += 1
            callback(*args)
