"""MemoryStore beyond the shared contract: bounds, eviction callback, sweeping, the synchronous fast path."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.memory import MemoryStore
from tiers.policies import POLICY_NAMES, make_policy
from tiers.policies.lru import LRUPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Collects ``on_evict`` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, frozenset[str], float, float | None]] = []

    def __call__(self, key: str, value: bytes, tags: frozenset[str], cost: float, ttl: float | None) -> None:
        self.calls.append((key, value, tags, cost, ttl))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_entries_give_the_garbage_collector_nothing_to_track(policy: str) -> None:
    """Entries (stored, read, tagged, with expiries) add no object the cyclic garbage collector tracks, so its full
    collections, which stall the event loop, do not grow with the cache. They used to add three per entry: with
    200,000 entries each full collection took 160-400 ms."""
    store = MemoryStore(make_policy(policy, 64 * 1024 * 1024), max_entries=10_000)
    gc.collect()
    tracked = len(gc.get_objects())
    for n in range(20_000):  # past max_entries: evictions too
        store.put_nowait(f"key {n}", b"answer %d" % n, ttl=60.0, tags=("all", "tenant:t", f"doc:{n % 7}"), cost=0.5)
        store.get_nowait(f"key {n // 2}")
    gc.collect()
    gc.collect()  # a tuple whose inner tuple was still tracked when the first one looked at it
    assert len(store) == 10_000
    assert len(gc.get_objects()) - tracked < 50


def test_byte_bound_evicts_least_recently_used_and_reports_it() -> None:
    clock = FakeClock()
    evicted = Recorder()
    store = MemoryStore(LRUPolicy(capacity=30), clock=clock, on_evict=evicted)
    store.put_nowait("a", b"x" * 10, tags=["t"], cost=2.5, ttl=60)
    store.put_nowait("b", b"y" * 10, tags=["t"])
    store.put_nowait("c", b"z" * 10)
    assert store.get_nowait("a") == b"x" * 10
    clock.now += 15
    store.put_nowait("d", b"w" * 10)
    assert store.get_nowait("b") is None
    assert evicted.calls == [("b", b"y" * 10, frozenset({"t"}), 1.0, None)]
    store.put_nowait("e", b"v" * 20)
    assert [c[0] for c in evicted.calls] == ["b", "c", "a"]
    assert evicted.calls[-1] == ("a", b"x" * 10, frozenset({"t"}), 2.5, 45.0)
    assert store.keys_with_tag_nowait("t") == []
    assert store.stats_nowait().bytes == 30


def test_entry_bound() -> None:
    evicted = Recorder()
    store = MemoryStore(LRUPolicy(capacity=10**6), max_entries=3, on_evict=evicted)
    for key in "abcde":
        store.put_nowait(key, key.encode())
    assert len(store) == 3
    assert [c[0] for c in evicted.calls] == ["a", "b"]
    assert len(store.policy) == 3
    assert store.get_nowait("e") == b"e"


def test_oversized_value_is_declined_and_replaces_nothing() -> None:
    store = MemoryStore(LRUPolicy(capacity=10))
    store.put_nowait("k", b"small")
    assert store.put_nowait("k", b"x" * 11) is False
    assert store.get_nowait("k") is None
    assert store.stats_nowait().entries == 0
    assert len(store.policy) == 0


def test_expired_entries_are_swept_by_writes_without_reads() -> None:
    clock = FakeClock()
    evicted = Recorder()
    store = MemoryStore(LRUPolicy(capacity=10**6), clock=clock, on_evict=evicted, sweep_batch=100)
    for i in range(50):
        store.put_nowait(f"k{i}", b"v", ttl=1, tags=["t"])
    clock.now += 2
    store.put_nowait("fresh", b"v")
    assert len(store) == 1
    assert store.policy.used == 1
    assert store.expirations == 50
    assert evicted.calls == []  # expiry is not eviction: nothing to demote


def test_overwritten_entry_keeps_its_new_ttl_despite_old_heap_item() -> None:
    clock = FakeClock()
    store = MemoryStore(LRUPolicy(capacity=10**6), clock=clock)
    store.put_nowait("k", b"1", ttl=1)
    store.put_nowait("k", b"2", ttl=100)
    clock.now += 2
    store.put_nowait("other", b"x")
    assert store.get_nowait("k") == b"2"


def test_age_nowait() -> None:
    clock = FakeClock()
    store = MemoryStore(LRUPolicy(capacity=100), clock=clock)
    store.put_nowait("k", b"v")
    clock.now += 7
    assert store.age_nowait("k") == 7
    assert store.age_nowait("absent") is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 40), st.booleans()),
        max_size=80,
    ),
    st.integers(1, 5),
)
def test_bounds_and_indexes_hold_for_any_sequence(ops: list[tuple[str, int, bool]], max_entries: int) -> None:
    evicted = Recorder()
    store = MemoryStore(LRUPolicy(capacity=100), max_entries=max_entries, on_evict=evicted)
    for key, size, delete in ops:
        if delete:
            store.delete_nowait(key)
        else:
            store.put_nowait(key, b"x" * size, tags=[f"size:{size % 3}"])
        stats = store.stats_nowait()
        assert stats.bytes <= 100
        assert stats.entries <= max_entries
        assert stats.entries == len(store.policy)
        assert stats.bytes == store.policy.used
        tagged = sorted(k for tag in ("size:0", "size:1", "size:2") for k in store.keys_with_tag_nowait(tag))
        assert tagged == sorted(k for k in "abcdefgh" if store.get_nowait(k) is not None)
