"""The embedded vector store's byte budget: partitions cost what they hold, are evicted whole within the budget (the
heaviest owner's least recently used first), and a reload takes no more than the budget."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tiers.embedders.base import normalize_rows
from tiers.vectors.hnsw import HnswVectorStore

DIM = 384


def unit(n: int, seed: int = 0) -> np.ndarray:
    return normalize_rows(np.random.default_rng(seed).standard_normal((n, DIM)))


def rss() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def tenant_of(partition: str) -> str:
    return partition.split("/", 1)[0]


async def test_a_partition_holds_no_memory_until_it_holds_entries_and_then_kilobytes() -> None:
    vectors = unit(300)
    gc.collect()
    before = rss()
    store = HnswVectorStore(DIM)
    assert await store.search("t/never-added", unit(1)[0], k=4) == [] and await store.count("t/never-added") == 0
    for n in range(300):  # 300 contexts of one question each: an hnswlib index apiece held 2.6 MB each (780 MB)
        await store.add(f"t/context-{n}", [f"key-{n}"], vectors[n : n + 1], [{"question": f"question {n}"}])
    grown = rss() - before
    assert grown < 30 * 1024 * 1024, f"300 one-entry partitions took {grown / 2**20:.0f} MB"
    assert store.partitions() == 300 and store.nbytes < 300 * 4096
    assert await store.delete([f"key-{n}" for n in range(300)]) == 300
    assert store.nbytes == 0 and store.partitions() == 0, "a partition goes with its last entry"


async def test_the_ledger_figure_is_what_partitions_hold() -> None:
    """The store's bytes against tracemalloc's count of what it allocated (numpy's rows included), for partitions of
    one, three and fifty entries."""
    for per, partitions in ((1, 400), (3, 150), (50, 8)):
        store = HnswVectorStore(DIM)
        vectors = unit(per)
        await store.add("warm-up", ["w"], vectors[:1])
        await store.delete(["w"])
        gc.collect()
        tracemalloc.start()
        try:
            for p in range(partitions):
                for i in range(per):
                    await store.add(f"tenant-{p % 3}/namespace-{p}/{p:032x}", [f"l1:{p}:{i}:" + "a" * 60],
                                    vectors[i : i + 1], [{"question": f"what is item {p} {i}?"}])
            gc.collect()
            measured = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert 0.9 <= store.nbytes / measured <= 1.25, (per, store.nbytes, measured)
        [account] = store.memory()
        assert (account.name, account.bytes, account.budget, account.entries) == \
            ("l2_index", store.nbytes, store.max_bytes, per * partitions)


async def test_many_partitions_stay_within_the_budget_by_evicting_whole_ones() -> None:
    budget = 400 * 1024
    store = HnswVectorStore(DIM, max_bytes=budget)
    vectors = unit(2)
    for n in range(500):
        await store.add(f"t/ns-{n}", [f"a-{n}", f"b-{n}"], vectors, [{"question": "q"}] * 2)
        assert store.nbytes <= budget
    held = store.partitions()
    assert 0 < held < 500 and store.evicted_partitions == 500 - held and store.trimmed == 0
    assert all([await store.count(f"t/ns-{n}") for n in range(500 - held, 500)])  # the newest, whole
    assert not any([await store.count(f"t/ns-{n}") for n in range(500 - held)])
    assert await store.count() == 2 * held


async def test_searched_partitions_are_kept_over_unused_ones() -> None:
    store = HnswVectorStore(DIM, max_bytes=100 * 1024)
    vectors = unit(1)
    await store.add("t/hot", ["hot"], vectors)
    for n in range(200):
        await store.search("t/hot", vectors[0], k=1)
        await store.add(f"t/cold-{n}", [f"cold-{n}"], vectors)
    assert await store.count("t/hot") == 1 and store.evicted_partitions > 0


async def test_a_flooding_owner_evicts_its_own_partitions_first() -> None:
    store = HnswVectorStore(DIM, max_bytes=200 * 1024, owner=tenant_of)
    vectors = unit(1)
    for n in range(10):
        await store.add(f"victim/ns-{n}", [f"victim-{n}"], vectors)
    for n in range(1000):
        await store.add(f"flooder/ns-{n}", [f"flooder-{n}"], vectors)
    assert store.nbytes <= 200 * 1024 and store.evicted_partitions > 900
    assert all([await store.count(f"victim/ns-{n}") for n in range(10)])


async def test_one_partition_past_the_budget_loses_its_oldest_entries_and_a_huge_entry_is_refused() -> None:
    budget = 4 * 1024 * 1024  # a graph of 512 slots fits, of 1024 does not
    store = HnswVectorStore(DIM, max_bytes=budget, graph_from=64)
    vectors = unit(700, seed=3)
    for n in range(700):
        await store.add("t/one", [str(n)], vectors[n : n + 1])
        assert store.nbytes <= budget
    count = await store.count("t/one")
    assert count == 512 and store.trimmed == 700 - 512  # a graph, trimmed in place: its slots are reused
    [hit] = await store.search("t/one", vectors[699], k=1)
    assert hit.id == "699"
    assert all(hit.id != "0" for hit in await store.search("t/one", vectors[0], k=4))
    await store.add("t/other", ["huge"], vectors[:1], [{"question": "x" * budget}])
    assert await store.count("t/other") == 0 and store.refused == 1 and store.nbytes <= budget


@pytest.mark.parametrize("graph_from", [4, 1024])
async def test_a_reload_takes_the_most_recently_used_partitions_up_to_the_budget(tmp_path: Path,
                                                                                   graph_from: int) -> None:
    store = HnswVectorStore(DIM, tmp_path, max_bytes=10**9, graph_from=graph_from)
    vectors = unit(6)
    for n in range(300):
        await store.add(f"t/ns-{n}", [f"{n}-{i}" for i in range(6)], vectors)
    await store.search("t/ns-0", vectors[0], k=1)  # the oldest, used again: among the newest now
    await store.persist()
    budget = store.nbytes // 10
    reloaded = HnswVectorStore(DIM, tmp_path, max_bytes=budget, graph_from=graph_from)
    loaded = await reloaded.load()
    assert reloaded.nbytes <= budget and 0 < loaded < 6 * 300 and loaded % 6 == 0
    assert await reloaded.count("t/ns-0") == 6 and await reloaded.count("t/ns-299") == 6
    assert await reloaded.count("t/ns-1") == 0
    [hit] = await reloaded.search("t/ns-299", vectors[2], k=1)
    assert hit.id == "299-2"
    await reloaded.persist()  # the partitions left out leave the directory too
    assert sum(name.endswith(".json") for name in os.listdir(tmp_path)) == reloaded.partitions() + 1
