"""Qdrant search bodies → (query vector, canonical hash of everything else)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_client import models

from normalizer.search_request import (
    DEFAULT_VECTOR,
    Distance,
    SearchEndpoint,
    parse_search,
    route,
    vector_metrics,
)

SEARCH = "/collections/docs/points/search"
QUERY = "/collections/docs/points/query"
RECOMMEND = "/collections/docs/points/recommend"


def one(path: str, body: dict[str, Any], query_params: dict[str, str] | None = None) -> Any:
    parsed = parse_search(path, orjson.dumps(body), query_params)
    assert parsed is not None, body
    assert len(parsed.items) == 1
    return parsed.items[0]


def test_routes() -> None:
    assert route(SEARCH) == ("docs", SearchEndpoint.SEARCH, False)
    assert route("/collections/docs/points/query/batch") == ("docs", SearchEndpoint.QUERY, True)
    assert route("/collections/docs/points/recommend/batch") == ("docs", SearchEndpoint.RECOMMEND, True)
    assert route("/collections/docs/points/scroll") is None
    assert route("/collections/docs/points/query/groups") is None


def test_search_dense_and_named_vectors() -> None:
    plain = one(SEARCH, {"vector": [1, 0.5, 0], "limit": 3})
    assert plain.vector_name == DEFAULT_VECTOR
    assert plain.vector is not None and plain.vector.dtype == np.float32
    assert plain.vector.tolist() == [1.0, 0.5, 0.0]
    named = one(SEARCH, {"vector": {"name": "title", "vector": [1, 0.5, 0]}, "limit": 3})
    assert named.vector_name == "title"
    assert named.params_hash != plain.params_hash  # another vector space


def test_query_dense_forms_are_one_and_the_same() -> None:
    a = one(QUERY, {"query": [0.1, 0.2], "limit": 5, "using": "body"})
    b = one(QUERY, {"query": {"nearest": [0.1, 0.2]}, "limit": 5, "using": "body"})
    assert a.approximable and b.approximable
    assert (a.params_hash, a.exact_key) == (b.params_hash, b.exact_key)
    assert not a.rank_sensitive and not a.payload_sensitive


@pytest.mark.parametrize(
    "query",
    [
        7,  # a point id
        "5c56c793-69f3-4fbf-87e6-c4bf54c28c26",
        {"indices": [1, 5], "values": [0.5, 0.2]},  # sparse
        [[0.1, 0.2], [0.3, 0.4]],  # multi-vector
        {"nearest": [0.1, 0.2], "mmr": {"diversity": 0.5}},
        {"recommend": {"positive": [1, 2], "negative": [3]}},
        {"fusion": "rrf"},
        {"order_by": "price"},
        {"formula": {"sum": ["$score", 1]}, "defaults": {}},
        {"text": "hello", "model": "bm25"},
    ],
)
def test_known_non_dense_queries_are_exact_only(query: Any) -> None:
    item = one(QUERY, {"query": query, "limit": 5})
    assert not item.approximable
    assert item.rank_sensitive and item.payload_sensitive
    other = one(QUERY, {"query": query, "limit": 6})
    assert other.exact_key != item.exact_key


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (QUERY, {"query": {"sample": "random"}}),  # random: never cacheable
        (QUERY, {"query": {"brand_new_query": 1}}),
        (QUERY, {"query": [0.1, "x"]}),
        (QUERY, {"query": [0.1, True]}),
        (QUERY, {"query": []}),
        (QUERY, {"query": [0.1], "unknown_field": 1}),
        (QUERY, {"query": [0.1], "prefetch": {"query": [0.1], "surprise": 1}}),
        (SEARCH, {"limit": 3}),  # no vector
        (SEARCH, {"vector": {"name": "a"}, "limit": 3}),
        (SEARCH, {"vector": [0.1], "limit": -1}),
        (SEARCH, {"vector": [1e39], "limit": 1}),  # overflows float32
        ("/collections/docs/points/search/batch", {"searches": "nope"}),
        ("/collections/docs/points/search/batch", {"searches": [{"vector": [0.1]}], "extra": 1}),
        ("/collections/docs/points/scroll", {"limit": 3}),
    ],
)
def test_unsupported_shapes_are_not_cacheable(path: str, body: dict[str, Any]) -> None:
    assert parse_search(path, orjson.dumps(body)) is None


def test_not_json_object_is_not_cacheable() -> None:
    assert parse_search(SEARCH, b"[1, 2]") is None
    assert parse_search(SEARCH, b"{not json") is None


def test_sparse_search_vector_is_exact_only() -> None:
    item = one(SEARCH, {"vector": {"name": "s", "vector": {"indices": [1], "values": [0.4]}}, "limit": 3})
    assert not item.approximable
    changed = one(SEARCH, {"vector": {"name": "s", "vector": {"indices": [1], "values": [0.5]}}, "limit": 3})
    assert changed.exact_key != item.exact_key


def test_recommend_is_exact_only() -> None:
    item = one(RECOMMEND, {"positive": [1, 2], "limit": 3})
    assert not item.approximable and item.rank_sensitive
    assert one(RECOMMEND, {"positive": [1, 3], "limit": 3}).exact_key != item.exact_key


def test_batch_items_in_order() -> None:
    body = {"searches": [{"query": [1.0, 0.0], "limit": 2}, {"query": 3}, {"query": [0.0, 1.0], "limit": 2}]}
    parsed = parse_search("/collections/docs/points/query/batch", orjson.dumps(body))
    assert parsed is not None and parsed.batch
    assert [item.approximable for item in parsed.items] == [True, False, True]
    assert parsed.items[0].params_hash == parsed.items[2].params_hash
    assert parsed.items[0].exact_key != parsed.items[2].exact_key


def test_null_fields_equal_absent_ones_and_key_order_is_irrelevant() -> None:
    a = one(QUERY, {"query": [0.5], "limit": 3, "filter": None})
    b = parse_search(QUERY, b'{"limit": 3, "query": [0.5]}')
    assert b is not None and a.exact_key == b.items[0].exact_key


def test_url_parameters_and_collection_are_part_of_the_hash() -> None:
    base = one(QUERY, {"query": [0.5], "limit": 3})
    assert one(QUERY, {"query": [0.5], "limit": 3}, {"consistency": "all"}).params_hash != base.params_hash
    other = parse_search("/collections/other/points/query", orjson.dumps({"query": [0.5], "limit": 3}))
    assert other is not None and other.items[0].params_hash != base.params_hash


def test_sensitivity_flags_and_lookup_collections() -> None:
    assert one(QUERY, {"query": [0.5], "offset": 5}).rank_sensitive
    filtered = one(QUERY, {"query": [0.5], "filter": {"must": [{"key": "a", "match": {"value": 1}}]}})
    assert filtered.payload_sensitive and not filtered.rank_sensitive
    pre = one(
        QUERY,
        {"query": [0.5], "prefetch": [{"query": [0.2], "limit": 20, "lookup_from": {"collection": "x"}}]},
    )
    assert pre.approximable and pre.rank_sensitive and pre.payload_sensitive
    assert pre.collections == frozenset({"docs", "x"})


# ---------------------------------------------------------------------------------------------------------------
# Property: every non-vector field matters; the vector alone never changes the partition.

json_scalars = st.one_of(st.booleans(), st.integers(-1000, 1000), st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
dense = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=4, max_size=4)
FIELDS = ["filter", "params", "score_threshold", "with_payload", "with_vector", "lookup_from", "shard_key"]


def base_body(vector: list[float]) -> dict[str, Any]:
    return {
        "query": vector,
        "limit": 10,
        "offset": 0,
        "using": "body",
        "filter": {"must": [{"key": "lang", "match": {"value": "en"}}]},
        "params": {"hnsw_ef": 64},
        "score_threshold": 0.2,
        "with_payload": True,
        "with_vector": False,
        "lookup_from": {"collection": "docs"},
        "shard_key": "a",
    }


@settings(max_examples=150, deadline=None)
@given(vector=dense, other=dense, field=st.sampled_from(FIELDS), value=json_values)
def test_any_non_vector_change_changes_the_hash(
    vector: list[float], other: list[float], field: str, value: Any
) -> None:
    body = base_body(vector)
    item = one(QUERY, body)
    assert one(QUERY, base_body(other)).params_hash == item.params_hash  # vector-only change: same partition
    changed = {**body, field: value}
    if changed[field] == body[field] or value is None:
        return
    parsed = parse_search(QUERY, orjson.dumps(changed))
    if parsed is not None:  # a change either makes it uncacheable or moves it to another partition
        assert parsed.items[0].params_hash != item.params_hash


@settings(max_examples=100, deadline=None)
@given(limit=st.integers(0, 50), offset=st.integers(0, 50), name=st.text(min_size=1, max_size=6))
def test_limit_offset_and_vector_name_are_in_the_hash(limit: int, offset: int, name: str) -> None:
    body = base_body([0.1, 0.2, 0.3, 0.4])
    item = one(QUERY, body)
    for field, value in (("limit", limit), ("offset", offset), ("using", name)):
        if body[field] != value:
            assert one(QUERY, {**body, field: value}).params_hash != item.params_hash


@settings(max_examples=100, deadline=None)
@given(vector=dense)
def test_exact_key_follows_float32_value(vector: list[float]) -> None:
    item = one(SEARCH, {"vector": vector, "limit": 3})
    assert item.exact_key == one(SEARCH, {"vector": [float(np.float32(v)) for v in vector], "limit": 3}).exact_key


# ---------------------------------------------------------------------------------------------------------------


def test_vector_metrics_from_collection_info_of_local_mode() -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(":memory:")
    client.create_collection("plain", vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT))
    client.create_collection(
        "named",
        vectors_config={
            "title": models.VectorParams(size=4, distance=models.Distance.COSINE),
            "body": models.VectorParams(size=4, distance=models.Distance.MANHATTAN),
        },
    )
    for name, expected in (
        ("plain", {DEFAULT_VECTOR: Distance.DOT}),
        ("named", {"title": Distance.COSINE, "body": Distance.MANHATTAN}),
    ):
        info = client.get_collection(name)
        body = {"result": info.model_dump(mode="json"), "status": "ok", "time": 0.0}
        assert vector_metrics(orjson.dumps(body)) == expected
    assert vector_metrics(b"{}") == {}
    assert vector_metrics(b"not json") == {}


def test_bodies_as_qdrant_client_sends_them() -> None:
    """qdrant-client's REST transport (exclude unset/None) produces bodies this parser understands."""
    from qdrant_client.http import models as rest
    from qdrant_client.http.api.search_api import jsonable_encoder as encode

    def jsonable_encoder(model: Any) -> Any:
        encoded = encode(model)  # a JSON string for pydantic models
        return orjson.loads(encoded) if isinstance(encoded, str | bytes) else encoded

    flt = rest.Filter(must=[rest.FieldCondition(key="lang", match=rest.MatchValue(value="en"))])
    plain = rest.QueryRequest(query=[0.1, 0.2, 0.3], limit=5, with_payload=True, filter=flt, using="body")
    nearest = rest.QueryRequest(
        query=rest.NearestQuery(nearest=[0.1, 0.2, 0.3]), limit=5, with_payload=True, filter=flt, using="body"
    )
    items = [one(QUERY, jsonable_encoder(request)) for request in (plain, nearest)]
    assert all(item.approximable and item.vector_name == "body" for item in items)
    assert items[0].exact_key == items[1].exact_key
    batch = jsonable_encoder(rest.QueryRequestBatch(searches=[plain, rest.QueryRequest(query=17, limit=5)]))
    parsed = parse_search("/collections/docs/points/query/batch", orjson.dumps(batch))
    assert parsed is not None and [item.approximable for item in parsed.items] == [True, False]


def test_explicit_defaults_equal_omitted_fields() -> None:
    path = "/collections/c/points/query"
    bare = parse_search(path, {"query": [0.1, 0.2], "with_payload": True})
    sdk = parse_search(path, {"query": {"nearest": [0.1, 0.2]}, "limit": 10, "with_vector": False,
                              "offset": 0, "with_payload": True})
    assert bare is not None and sdk is not None
    assert bare.items[0].exact_key == sdk.items[0].exact_key
    other = parse_search(path, {"query": [0.1, 0.2], "with_payload": True, "with_vector": True})
    assert other is not None and other.items[0].params_hash != bare.items[0].params_hash
