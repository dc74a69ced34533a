"""``tiers.invalidation`` over real in-memory tiers: AND of selectors, the semantic radius (with a test-double
embedder), hooks into the semantic index and the retrieval cache, flush; and ``proxy.observability.stats`` decisions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.observability.stats import RequestStats, SpaceSaving, histogram_quantile
from tiers.entry import CachedResponse
from tiers.invalidation import Invalidator, InvalidSelector, Near, Selector
from tiers.memory import MemoryStore
from tiers.policies.lru import LRUPolicy
from tiers.response_tier import ResponseTier
from tiers.retrieval.writes import WriteEffect, WriteScope

WORDS = ["capital", "france", "paris", "weather", "today", "python", "release"]


class BagOfWordsEmbedder:
    """TEST DOUBLE of an embedder: one dimension per known word (deterministic, no model)."""

    dim = len(WORDS)

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().replace("?", "").split():
                if word in WORDS:
                    rows[i, WORDS.index(word)] += 1.0
        return rows


class RecordingIndex:
    """TEST DOUBLE of the semantic index: remembers which keys it was told to forget."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete(self, entry_keys: Sequence[str]) -> int:
        self.deleted.extend(entry_keys)
        return len(entry_keys)


class RecordingSearches:
    """TEST DOUBLE of the retrieval cache: records the write effects it receives."""

    def __init__(self) -> None:
        self.effects: list[WriteEffect] = []

    async def invalidate(self, effect: WriteEffect) -> int:
        self.effects.append(effect)
        return 3


def tier(name: str) -> ResponseTier:
    return ResponseTier(name, MemoryStore(LRUPolicy(10_000_000)))


async def put(t: ResponseTier, key: str, *, tenant: str = "t", ns: str = "n", model: str = "m",
              question: str = "q", docs: Sequence[str] = (), created: float = 1000.0) -> None:
    entry = CachedResponse(body=b"{}", kind="chat", model=model, created=created,
                           meta={"tenant": tenant, "namespace": ns, "question": question})
    tags = ["all", f"tenant:{tenant}", f"ns:{tenant}/{ns}", f"model:{model}", *(f"doc:{d}" for d in docs)]
    assert await t.put(key, entry, ttl=None, tags=tags)


async def keys(t: ResponseTier) -> list[str]:
    return sorted(await t.store.keys_with_tag("all"))


async def test_and_of_selectors_across_tiers() -> None:
    l1, l3 = tier("l1"), tier("l3")
    for t in (l1, l3):
        await put(t, "a", tenant="t1", ns="x", model="m1", docs=["d1"])
        await put(t, "b", tenant="t1", ns="y", model="m1", docs=["d1", "d2"])
        await put(t, "c", tenant="t2", ns="x", model="m2", docs=["d2"])
    index = RecordingIndex()
    removed: list[str] = []
    invalidator = Invalidator([l1, l3], semantic=index, on_removed=removed.extend, clock=lambda: 2000.0)
    outcome = await invalidator.invalidate(Selector(tenant="t1", documents=("d2", "d9")))
    assert outcome.removed == {"l1": 1, "l3": 1, "semantic": 1} and outcome.keys == ["b"]
    assert index.deleted == ["b"] and removed == ["b"]
    assert (await invalidator.invalidate(Selector(namespace="x", model="m2"))).keys == ["c"]
    assert (await invalidator.invalidate(Selector(keys=("a", "zzz"), model="m2"))).keys == []
    assert (await invalidator.invalidate(Selector())).total == 0, "an empty selector selects nothing"
    assert await keys(l1) == ["a"] and await keys(l3) == ["a"]


async def test_age_bounds() -> None:
    l1 = tier("l1")
    await put(l1, "old", created=100.0)
    await put(l1, "new", created=950.0)
    invalidator = Invalidator([l1], clock=lambda: 1000.0)
    assert (await invalidator.invalidate(Selector(older_than_s=500))).keys == ["old"]
    assert (await invalidator.invalidate(Selector(newer_than_s=10))).keys == []
    assert (await invalidator.invalidate(Selector(newer_than_s=60))).keys == ["new"]


async def test_semantic_radius() -> None:
    l1 = tier("l1")
    await put(l1, "paris", question="capital france")
    await put(l1, "paris2", question="France capital paris")
    await put(l1, "weather", question="weather today")
    invalidator = Invalidator([l1], embedder=BagOfWordsEmbedder())
    near = Near("What is the capital of France?", radius=0.2)
    outcome = await invalidator.invalidate(Selector(near=near))
    assert outcome.keys == ["paris", "paris2"]  # cosine 1.0 and 0.816 → distance 0 and 0.18
    assert await keys(l1) == ["weather"]
    with pytest.raises(InvalidSelector):
        await Invalidator([l1]).invalidate(Selector(near=near))


async def test_retrieval_cache_hooks() -> None:
    searches = RecordingSearches()
    invalidator = Invalidator([tier("l1")], retrieval=searches, collections=lambda: ["docs", "faq"])
    assert (await invalidator.invalidate(Selector(collection="docs"))).removed["retrieval"] == 3
    await invalidator.invalidate(Selector(documents=("7", "not-a-point-id")))
    uuid = "6F1A2B3C-0000-4000-8000-000000000001"
    await invalidator.invalidate(Selector(documents=(uuid,), collection="faq"))
    flushed = await invalidator.flush(["retrieval"])
    assert flushed.removed == {"retrieval": 3}
    assert searches.effects == [
        WriteEffect(WriteScope.COLLECTION, "docs"),
        WriteEffect(WriteScope.PAYLOAD_CHANGED, "docs", frozenset({7})),
        WriteEffect(WriteScope.PAYLOAD_CHANGED, "faq", frozenset({7})),
        WriteEffect(WriteScope.PAYLOAD_CHANGED, "faq", frozenset({uuid.lower()})),
        WriteEffect(WriteScope.ALL),
    ]


async def test_flush_names_tiers() -> None:
    l1, l3 = tier("l1"), tier("l3")
    await put(l1, "a")
    await put(l3, "a")
    index = RecordingIndex()
    invalidator = Invalidator([l1, l3], semantic=index)
    assert (await invalidator.flush(["l3"])).removed == {"l3": 1}
    assert await keys(l1) == ["a"]
    assert (await invalidator.flush(["l1"])).removed == {"l1": 1}, "the tiers flushed, nothing else"
    assert index.deleted == [], "the semantic index is not flushed with one answer tier"
    await put(l1, "b")
    assert (await invalidator.flush()).removed == {"l1": 1, "l3": 0, "semantic": 1}, "everything, the index too"
    with pytest.raises(InvalidSelector):
        await invalidator.flush(["nope"])


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=400), st.integers(min_value=1, max_value=12))
def test_space_saving_guarantees(stream: list[int], capacity: int) -> None:
    top = SpaceSaving(capacity)
    for item in stream:
        top.add(str(item))
    counted = {c.key: c for c in top.top(capacity)}
    for item in set(stream):
        true = stream.count(item)
        if true > len(stream) / capacity:
            assert str(item) in counted, "a heavy hitter is always kept"
        if str(item) in counted:
            c = counted[str(item)]
            assert true <= c.count <= true + c.error


def test_histogram_quantile_matches_prometheus() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * 10 / 20)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 9.6 / 10)
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_request_stats_prices_hits_from_the_miss() -> None:
    stats = RequestStats(clock=lambda: 100.0)
    stats.record(route="chat", cache_status="MISS", tier=None, key="k", upstream_seconds=2.5)
    assert stats.record(route="chat", cache_status="HIT", tier="l1", key="k") == 2.5
    assert stats.record(route="chat", cache_status="HIT", tier="l1", key="j", hit_cost=1.0) == 1.0
    stats.record(route="chat", cache_status="HIT", tier="l1", key="unknown")
    stats.record(route="chat", cache_status="MISS", tier="coalesced", key="k")
    snapshot = stats.snapshot()
    assert snapshot["cost_saved_s"] == 3.5 and snapshot["hits_without_cost"] == 1 and snapshot["coalesced"] == 1
    assert snapshot["total"]["hits"] == 3 and snapshot["total"]["misses"] == 2
