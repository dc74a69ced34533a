"""Demotion into L3: entries evicted from an in-process store land in the cold store in the background; a full
queue drops and counts instead of blocking."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest

from tiers.cold import ColdStore
from tiers.demotion import Demoter
from tiers.memory import MemoryStore
from tiers.policies.lru import LRUPolicy


class GatedStore:
    """A demotion target that holds every put until released (test double for a slow disk)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.stored: list[str] = []

    async def put(
        self, key: str, value: bytes, *, ttl: float | None = None, tags: Iterable[str] = (), cost: float = 1.0
    ) -> bool:
        await self.release.wait()
        self.stored.append(key)
        return True


class FailingStore:
    """A demotion target whose disk is gone (test double)."""

    async def put(
        self, key: str, value: bytes, *, ttl: float | None = None, tags: Iterable[str] = (), cost: float = 1.0
    ) -> bool:
        raise OSError("disk full")


async def test_evicted_entries_are_demoted_with_tags_and_remaining_ttl(tmp_path: Path) -> None:
    cold = await ColdStore(tmp_path).opened()
    demoter = Demoter(cold)
    demoter.start()
    memory = MemoryStore(LRUPolicy(capacity=20), on_evict=demoter.offer)
    try:
        memory.put_nowait("a", b"x" * 10, tags=["tenant:t"], ttl=300)
        memory.put_nowait("b", b"y" * 10)
        memory.put_nowait("c", b"z" * 10)  # evicts a
        await demoter.stop()
        assert demoter.demoted == 1
        assert await cold.get("a") == b"x" * 10
        assert await cold.keys_with_tag("tenant:t") == ["a"]
        hot = await cold.hottest(1)
        assert hot[0].ttl is not None and 0 < hot[0].ttl <= 300
    finally:
        await cold.close()


async def test_full_queue_drops_and_counts_without_blocking() -> None:
    target = GatedStore()
    demoter = Demoter(target, max_queue=3)
    demoter.start()
    for i in range(10):
        demoter.offer(f"k{i}", b"v", frozenset(), 1.0, None)  # synchronous: cannot block
    await asyncio.sleep(0)
    assert demoter.offered == 10
    assert demoter.dropped >= 6
    target.release.set()
    await demoter.stop()
    assert demoter.demoted + demoter.dropped == 10
    assert target.stored == [f"k{i}" for i in range(demoter.demoted)]


async def test_failing_target_is_counted_and_skipped() -> None:
    demoter = Demoter(FailingStore())
    demoter.start()
    for i in range(3):
        demoter.offer(f"k{i}", b"v", frozenset(), 1.0, None)
    await demoter.stop()
    assert demoter.failed == 3 and demoter.demoted == 0


async def test_demoted_vectors_are_kept_by_the_cold_store(tmp_path: Path) -> None:
    cold = await ColdStore(tmp_path).opened()
    demoter = Demoter(cold)
    demoter.start()
    try:
        demoter.offer("semantic", b"answer", frozenset({"tenant:t"}), 1.0, None, vector=[0.6, 0.8])
        await demoter.stop()
        [(key, score)] = await cold.nearest([0.6, 0.8], k=1, tag="tenant:t")
        assert key == "semantic" and score == pytest.approx(1.0, abs=1e-3)
    finally:
        await cold.close()
