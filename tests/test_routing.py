"""Pure tests of the load-balancer state (core/routing.py)."""

from __future__ import annotations

import zlib

import pytest

from core.routing import DEFAULT_STICKY_CAPACITY, LoadBalancerState, NoReplicaAvailable


def make_lb(*replica_ids: str, sticky_capacity: int = DEFAULT_STICKY_CAPACITY) -> LoadBalancerState:
    return LoadBalancerState(replica_ids=replica_ids, sticky_capacity=sticky_capacity)


def test_an_empty_pool_raises_no_replica_available() -> None:
    lb = make_lb()
    with pytest.raises(NoReplicaAvailable):
        lb.acquire("r0")


def test_least_inflight_wins_and_ties_go_to_the_earliest_inserted_replica() -> None:
    lb = make_lb("a", "b", "c")
    assert [lb.acquire(f"r{i}") for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    lb.release("b")
    assert lb.acquire("r6") == "b"
    lb.release("c")
    lb.release("a")
    # a and c both at 1 in flight: a was inserted first.
    assert lb.loads() == {"a": 1, "b": 2, "c": 1}
    assert lb.acquire("r7") == "a"


def test_a_sticky_request_returns_to_its_replica_even_when_it_is_busier() -> None:
    lb = make_lb("a", "b")
    assert lb.acquire("r0") == "a"
    assert lb.acquire("r0") == "a"
    assert lb.loads() == {"a": 2, "b": 0}


def test_sticky_entry_to_a_removed_replica_is_dropped_and_rerouted() -> None:
    lb = make_lb("a", "b")
    assert lb.acquire("r0") == "a"
    assert lb.remove_replicas(["a"]) == ["a"]
    assert lb.sticky_replica("r0") == "a"  # removed lazily
    assert lb.acquire("r0") == "b"
    assert lb.sticky_replica("r0") == "b"
    # Re-adding the replica does not pull the request back.
    lb.add_replicas(["a"])
    assert lb.acquire("r0") == "b"


def test_a_removed_replica_is_never_returned() -> None:
    lb = make_lb("h0", "h1", "s0")
    lb.remove_replicas(["h0", "h1"])
    assert {lb.acquire(f"r{i}") for i in range(20)} == {"s0"}


def test_release_floors_at_zero_and_ignores_unknown_replicas() -> None:
    lb = make_lb("a")
    lb.release("a")
    lb.release("gone")
    assert lb.loads() == {"a": 0}
    assert lb.total_inflight() == 0


def test_add_replicas_skips_present_ones_and_keeps_their_inflight() -> None:
    lb = make_lb("a")
    lb.acquire("r0")
    assert lb.add_replicas(["a", "b"]) == ["b"]
    assert lb.loads() == {"a": 1, "b": 0}
    assert lb.replica_ids == ("a", "b")
    with pytest.raises(ValueError):
        lb.add_replicas([""])


def test_a_readded_replica_goes_to_the_end_of_the_tie_order() -> None:
    lb = make_lb("a", "b")
    lb.remove_replicas(["a"])
    lb.add_replicas(["a"])
    assert lb.replica_ids == ("b", "a")
    assert lb.acquire("r0") == "b"


def test_sticky_map_is_an_lru_bounded_by_capacity() -> None:
    lb = make_lb("a", "b", sticky_capacity=3)
    for rid in ("r0", "r1", "r2"):
        lb.acquire(rid)
    lb.acquire("r0")  # touch r0: r1 is now the least recently used
    lb.acquire("r3")
    assert lb.num_sticky == 3
    assert lb.sticky_replica("r1") is None
    assert lb.sticky_replica("r0") is not None
    assert lb.sticky_replica("r3") is not None


def test_clear_sticky_returns_the_number_cleared_and_routing_falls_back_to_least_inflight() -> None:
    lb = make_lb("a", "b")
    lb.acquire("r0")  # a
    lb.acquire("r1")  # b
    lb.release("a")
    assert lb.clear_sticky() == 2
    assert lb.num_sticky == 0
    assert lb.acquire("r1") == "a"


def test_forget_drops_one_sticky_entry() -> None:
    lb = make_lb("a")
    lb.acquire("r0")
    assert lb.forget("r0") is True
    assert lb.forget("r0") is False


def test_full_determinism_uses_a_stable_crc32_hash() -> None:
    lb = LoadBalancerState(replica_ids=("a", "b", "c"), full_determinism=True)
    for i in range(10):
        rid = f"sample_0_{i}"
        assert lb.acquire(rid) == ("a", "b", "c")[zlib.crc32(rid.encode()) % 3]


def test_total_inflight_counts_every_acquired_attempt() -> None:
    lb = make_lb("a", "b")
    for i in range(5):
        lb.acquire(f"r{i}")
    lb.release("a")
    assert lb.total_inflight() == 4


def test_bad_capacity_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        LoadBalancerState(sticky_capacity=0)
