"""Load-balancer state: which rollout replica serves each generation request.

Where it sits: the rollouter asks the loadbalancer service for a replica before
every generation attempt (``acquire``) and reports completion (``release``); the
controller adds and removes replicas around hybrid activation/deactivation. The
service owns the I/O; this module is the pure state it mutates (no I/O, no
clock), so the simulator drives the very same object.

Semantics are those of verl's ``GlobalRequestLoadBalancer``:

- ``acquire(request_id)``: a sticky entry whose replica is still registered
  wins (so a partial rollout resumes where its prefix is cached); a sticky
  entry to a removed replica is deleted and the request rerouted; otherwise the
  least in-flight replica wins, ties going to the earliest inserted one; the
  choice is stored as the new sticky entry. An empty pool raises
  ``NoReplicaAvailable``.
- ``release(replica_id)``: decrement, floored at 0; unknown replicas ignored
  (a release may arrive after the replica was removed).
- The sticky map is an LRU bounded to ``sticky_capacity`` entries (10,000).
- ``full_determinism``: ``crc32(request_id) % N`` over the registered replicas
  in insertion order (a stable hash, unlike Python's salted ``hash``).

A removed replica is never returned: that is how "a request never reaches a
removed replica" holds for new acquisitions.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterable

DEFAULT_STICKY_CAPACITY = 10_000


class NoReplicaAvailable(RuntimeError):
    """The pool is empty: the caller waits and retries (``only_hybrid``) or fails."""


class LoadBalancerState:
    """In-flight counts per replica plus the bounded sticky map.

    ``inflight`` keeps replicas in insertion order; that order breaks ties.
    """

    def __init__(
        self,
        *,
        replica_ids: Iterable[str] = (),
        sticky_capacity: int = DEFAULT_STICKY_CAPACITY,
        full_determinism: bool = False,
    ) -> None:
        if sticky_capacity < 1:
            raise ValueError(f"sticky_capacity must be >= 1, got {sticky_capacity}")
        self.sticky_capacity = sticky_capacity
        self.full_determinism = full_determinism
        self.inflight: dict[str, int] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self.add_replicas(replica_ids)

    # -- routing -------------------------------------------------------------

    def acquire(self, request_id: str) -> str:
        """Pick the replica for one generation attempt and count it in flight."""
        if not self.inflight:
            raise NoReplicaAvailable(f"no replica registered for request {request_id!r}")
        replica_id = self._sticky.get(request_id)
        if replica_id is not None:
            if replica_id in self.inflight:
                self._sticky.move_to_end(request_id)
                self.inflight[replica_id] += 1
                return replica_id
            del self._sticky[request_id]
        replica_id = self._choose(request_id)
        self._sticky[request_id] = replica_id
        if len(self._sticky) > self.sticky_capacity:
            self._sticky.popitem(last=False)
        self.inflight[replica_id] += 1
        return replica_id

    def _choose(self, request_id: str) -> str:
        ids = list(self.inflight)
        if self.full_determinism:
            return ids[zlib.crc32(request_id.encode()) % len(ids)]
        # min() returns the first minimum in iteration (= insertion) order.
        return min(ids, key=self.inflight.__getitem__)

    def set_inflight(self, replica_id: str, count: int) -> None:
        """Seed a member's count: a restarted load balancer counts what the replica has not
        answered yet, instead of starting from zero. Unknown replicas are ignored."""
        if replica_id in self.inflight:
            self.inflight[replica_id] = max(0, count)

    def release(self, replica_id: str) -> None:
        """One attempt on ``replica_id`` finished (or was aborted)."""
        count = self.inflight.get(replica_id)
        if count is not None:
            self.inflight[replica_id] = max(0, count - 1)

    # -- membership ----------------------------------------------------------

    def add_replicas(self, replica_ids: Iterable[str]) -> list[str]:
        """Register replicas with 0 in flight; already present ones are skipped.

        Returns the ids actually added, in order.
        """
        added: list[str] = []
        for replica_id in replica_ids:
            if not replica_id:
                raise ValueError(f"replica id must be a non-empty string, got {replica_id!r}")
            if replica_id not in self.inflight:
                self.inflight[replica_id] = 0
                added.append(replica_id)
        return added

    def remove_replicas(self, replica_ids: Iterable[str]) -> list[str]:
        """Unregister replicas; their sticky entries die lazily at the next acquire.

        Returns the ids actually removed, in order.
        """
        removed: list[str] = []
        for replica_id in replica_ids:
            if self.inflight.pop(replica_id, None) is not None:
                removed.append(replica_id)
        return removed

    def clear_sticky(self) -> int:
        """Forget every sticky entry (used before a rebalance); returns how many."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return cleared

    def forget(self, request_id: str) -> bool:
        """Drop one sticky entry (request finished for good); True if one existed."""
        return self._sticky.pop(request_id, None) is not None

    # -- views ---------------------------------------------------------------

    def sticky_replica(self, request_id: str) -> str | None:
        """The sticky replica of ``request_id`` without touching LRU order."""
        return self._sticky.get(request_id)

    @property
    def replica_ids(self) -> tuple[str, ...]:
        """Registered replicas in insertion order."""
        return tuple(self.inflight)

    @property
    def num_sticky(self) -> int:
        return len(self._sticky)

    def total_inflight(self) -> int:
        return sum(self.inflight.values())

    def loads(self) -> dict[str, int]:
        """A copy of in-flight counts per replica, in insertion order."""
        return dict(self.inflight)
