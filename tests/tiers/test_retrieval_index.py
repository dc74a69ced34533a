"""ProximityIndex: tolerance per metric, exact repeats, capacity bounds, invalidation (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient, models

from normalizer.search_request import Distance, SearchItem, parse_search
from tiers.policies.lru import LRUPolicy
from tiers.retrieval.distance import distances, prepare, unit_vector_tolerance
from tiers.retrieval.index import ENTRY_OVERHEAD_BYTES, TRACKED_ID_BYTES, ProximityIndex
from tiers.retrieval.writes import WriteEffect, WriteScope

QUERY = "/collections/docs/points/query"


def item(vector: list[float], **fields: Any) -> SearchItem:
    parsed = parse_search(QUERY, orjson.dumps({"query": vector, "limit": 3, **fields}))
    assert parsed is not None
    return parsed.items[0]


def index_for(metric: Distance | None, tolerance: float | None = None, **kwargs: Any) -> ProximityIndex:
    index = ProximityIndex(LRUPolicy(kwargs.pop("capacity", 10**9)), **kwargs)
    if metric is not None:
        index.set_metrics("docs", {"": metric})
    if tolerance is not None:
        index.set_tolerance("docs", tolerance)
    return index


def store(index: ProximityIndex, it: SearchItem, ids: list[int] | None = None, tenant: str = "t") -> str:
    admission = index.admit(
        tenant,
        "docs",
        it,
        result_ids=ids if ids is not None else [1, 2, 3],
        size=100,
        seen_versions=index.versions(it.collections),
    )
    assert admission.admitted
    return admission.key


# -- distances agree with Qdrant's own scores ---------------------------------------------------------------------

vectors = st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=4, max_size=4).filter(
    lambda v: float(np.linalg.norm(v)) > 1e-3
)


@settings(max_examples=40, deadline=None)
@given(cached=vectors, asked=vectors)
def test_distance_matches_qdrant_scores(cached: list[float], asked: list[float]) -> None:
    """Cosine: 1 - score; Euclid and Manhattan: the score itself, from qdrant-client local mode."""
    client = QdrantClient(":memory:")
    for metric in (Distance.COSINE, Distance.EUCLID, Distance.MANHATTAN):
        name = metric.value.lower()
        client.create_collection(name, vectors_config=models.VectorParams(size=4, distance=models.Distance(metric)))
        client.upsert(name, points=[models.PointStruct(id=1, vector=cached)])
        score = client.query_points(name, query=asked, limit=1).points[0].score
        expected = 1.0 - score if metric is Distance.COSINE else score
        rows = prepare(metric, np.asarray(cached, dtype=np.float32))[None, :]
        ours = float(distances(metric, rows, prepare(metric, np.asarray(asked, dtype=np.float32)))[0])
        assert ours == pytest.approx(expected, abs=1e-4, rel=1e-4)


@pytest.mark.parametrize(
    ("metric", "asked", "distance"),
    [
        (Distance.COSINE, [1.0, 1.0, 0.0, 0.0], 1 - 1 / np.sqrt(2)),
        (Distance.EUCLID, [1.0, 0.3, 0.0, 0.0], 0.3),
        (Distance.DOT, [1.0, 0.0, 0.4, 0.0], 0.4),
        (Distance.MANHATTAN, [1.2, 0.1, 0.0, 0.0], 0.3),
    ],
)
def test_tolerance_is_a_bound_in_the_collection_metric(metric: Distance, asked: list[float], distance: float) -> None:
    cached = item([1.0, 0.0, 0.0, 0.0])
    for tolerance, hit in ((distance * 0.99, False), (distance * 1.01, True)):
        index = index_for(metric, tolerance)
        key = store(index, cached)
        found = index.match("t", "docs", item(asked))
        assert (found is not None) is hit, (metric, tolerance)
        if found is not None:
            assert found.key == key and not found.exact
            assert found.distance == pytest.approx(distance, rel=1e-5)


def test_cosine_ignores_scale_but_dot_does_not() -> None:
    cosine, dot = index_for(Distance.COSINE, 0.01), index_for(Distance.DOT, 0.01)
    for index in (cosine, dot):
        store(index, item([1.0, 2.0, 3.0, 4.0]))
    scaled = item([2.0, 4.0, 6.0, 8.0])
    assert cosine.match("t", "docs", scaled) is not None
    assert dot.match("t", "docs", scaled) is None


def test_nearest_of_several_candidates_wins() -> None:
    index = index_for(Distance.EUCLID, 1.0)
    store(index, item([0.0, 0.0, 0.0, 0.0]))
    near = store(index, item([0.5, 0.0, 0.0, 0.0]))
    found = index.match("t", "docs", item([0.45, 0.0, 0.0, 0.0]))
    assert found is not None and found.key == near


def test_default_tolerances() -> None:
    index = ProximityIndex(LRUPolicy(10**9), default_tolerance=0.05)
    index.set_metrics("docs", {"": Distance.COSINE, "e": Distance.EUCLID})
    index.set_metrics("raw", {})
    assert index.tolerance("docs", "") == 0.05
    assert index.tolerance("docs", "e") == 0.0  # absolute metrics: exact repeats unless configured
    assert index.tolerance("raw", "") == 0.0  # metric unknown
    index.set_tolerance("docs", 0.3, vector_name="e")
    assert index.tolerance("docs", "e") == 0.3
    assert unit_vector_tolerance(Distance.EUCLID, 0.02) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        unit_vector_tolerance(Distance.MANHATTAN, 0.02)
    with pytest.raises(ValueError):
        index.set_tolerance("docs", -1.0)


def test_exact_repeat_without_metric_or_tolerance() -> None:
    index = index_for(None)
    key = store(index, item([0.1, 0.2, 0.3, 0.4]))
    found = index.match("t", "docs", item([0.1, 0.2, 0.3, 0.4]))
    assert found is not None and found.exact and found.key == key
    assert index.match("t", "docs", item([0.1, 0.2, 0.3, 0.41])) is None


def test_non_vector_fields_and_tenants_separate_partitions() -> None:
    index = index_for(Distance.COSINE, 0.5)
    store(index, item([1.0, 0.0, 0.0, 0.0]))
    assert index.match("t", "docs", item([1.0, 0.0, 0.0, 0.0], with_payload=True)) is None
    assert index.match("t", "docs", item([1.0, 0.0, 0.0, 0.0], limit=4)) is None
    assert index.match("other-tenant", "docs", item([1.0, 0.0, 0.0, 0.0])) is None
    assert index.match("t", "docs", item([1.0, 0.1, 0.0, 0.0])) is not None


def test_other_dimension_never_matches_approximately() -> None:
    index = index_for(Distance.COSINE, 1.0)
    store(index, item([1.0, 0.0, 0.0, 0.0]))
    assert index.match("t", "docs", item([1.0, 0.0, 0.0])) is None


# -- capacity --------------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 60), per_partition=st.integers(1, 10), budget_entries=st.integers(1, 30))
def test_capacity_bounds_hold(count: int, per_partition: int, budget_entries: int) -> None:
    entry_size = 100 + 16 + ENTRY_OVERHEAD_BYTES + 3 * TRACKED_ID_BYTES  # result, 4 float32, overhead, 3 point ids
    index = index_for(
        Distance.COSINE, 0.0, capacity=budget_entries * entry_size, max_entries_per_partition=per_partition
    )
    rng = np.random.default_rng(count)
    for i in range(count):
        store(index, item(rng.normal(size=4).tolist(), limit=1 + i % 3))
        assert len(index) <= budget_entries
        assert index.policy.used <= index.policy.capacity
        assert len(index) == len(index.policy)
    for partition in index._partitions.values():
        assert len(partition) <= per_partition


def test_partition_cap_evicts_least_recently_used() -> None:
    index = index_for(Distance.EUCLID, 0.01, max_entries_per_partition=2)
    first = store(index, item([0.0, 0.0, 0.0, 1.0]))
    second = store(index, item([0.0, 0.0, 1.0, 0.0]))
    assert index.match("t", "docs", item([0.0, 0.0, 0.0, 1.0])) is not None  # first is now the most recent
    third = store(index, item([0.0, 1.0, 0.0, 0.0]))
    assert first in index and third in index and second not in index


def test_same_search_stored_twice_replaces_itself() -> None:
    index = index_for(Distance.COSINE)
    a = store(index, item([0.3, 0.2, 0.1, 0.0]))
    b = store(index, item([0.3, 0.2, 0.1, 0.0]))
    assert a == b and len(index) == 1 and len(index.policy) == 1


# -- invalidation ------------------------------------------------------------------------------------------------


def test_collection_write_drops_everything_reading_it() -> None:
    index = index_for(Distance.COSINE, 0.1)
    kept_elsewhere = index.admit(
        "t",
        "other",
        parse_search("/collections/other/points/query", b'{"query": [1, 0]}').items[0],  # type: ignore[union-attr]
        result_ids=[1],
        size=10,
        seen_versions={},
    ).key
    looked_up = store(index, item([0.0, 1.0, 0.0, 0.0], lookup_from={"collection": "other"}))
    plain = store(index, item([1.0, 0.0, 0.0, 0.0]))
    dropped = index.invalidate(WriteEffect(WriteScope.COLLECTION, "other"))
    assert set(dropped) == {kept_elsewhere, looked_up}
    assert plain in index
    assert index.invalidate(WriteEffect(WriteScope.COLLECTION, "docs")) == [plain]
    assert len(index) == 0 and len(index.policy) == 0


def test_point_deletes_drop_only_searches_that_contained_them() -> None:
    index = index_for(Distance.COSINE, 0.0)
    holds_7 = store(index, item([1.0, 0.0, 0.0, 0.0]), ids=[5, 7])
    other = store(index, item([0.0, 1.0, 0.0, 0.0]), ids=[1, 2])
    paged = store(index, item([0.0, 0.0, 1.0, 0.0], offset=10), ids=[3])
    filtered = store(index, item([0.0, 0.0, 0.0, 1.0], filter={"must": []}), ids=[4])
    dropped = index.invalidate(WriteEffect(WriteScope.POINTS_REMOVED, "docs", frozenset({7})))
    assert set(dropped) == {holds_7, paged}  # paged: a deletion above the page shifts it
    assert other in index and filtered in index
    dropped = index.invalidate(WriteEffect(WriteScope.PAYLOAD_CHANGED, "docs", frozenset({2})))
    assert set(dropped) == {other, filtered}  # filtered: the payload change may make a point match
    assert index._by_point == {}


def test_untracked_results_are_dropped_by_any_point_write() -> None:
    index = index_for(Distance.COSINE, 0.0, max_tracked_ids=2)
    many = store(index, item([1.0, 0.0, 0.0, 0.0]), ids=[1, 2, 3])
    unknown = index.admit("t", "docs", item([0.0, 1.0, 0.0, 0.0]), result_ids=None, size=10, seen_versions={}).key
    assert set(index.invalidate(WriteEffect(WriteScope.PAYLOAD_CHANGED, "docs", frozenset({99})))) == {
        many,
        unknown,
    }


def test_a_search_that_raced_a_write_is_not_stored() -> None:
    index = index_for(Distance.COSINE, 0.1)
    it = item([1.0, 0.0, 0.0, 0.0])
    seen = index.versions(it.collections)
    index.invalidate(WriteEffect(WriteScope.POINTS_REMOVED, "docs", frozenset({1})))
    assert not index.admit("t", "docs", it, result_ids=[2], size=10, seen_versions=seen).admitted
    seen = index.versions(it.collections)
    index.invalidate(WriteEffect(WriteScope.ALL))  # aliases changed
    assert not index.admit("t", "docs", it, result_ids=[2], size=10, seen_versions=seen).admitted
    assert index.admit("t", "docs", it, result_ids=[2], size=10, seen_versions=index.versions(it.collections)).admitted


def test_metric_change_drops_the_collection() -> None:
    index = index_for(Distance.COSINE, 0.1)
    key = store(index, item([1.0, 0.0, 0.0, 0.0]))
    assert index.set_metrics("docs", {"": Distance.COSINE}) == []
    assert index.set_metrics("docs", {"": Distance.DOT}) == [key]


def test_the_metrics_of_at_most_max_versions_collections_are_kept() -> None:
    """Every tenant's collection is its own: their number is the tenants' to grow, the table is not."""
    index = ProximityIndex(LRUPolicy(10**9), max_versions=3)
    for n in range(10):
        index.set_metrics(f"c{n}", {"": Distance.COSINE})
    assert [index.metrics(f"c{n}") is not None for n in range(10)] == [False] * 7 + [True] * 3
