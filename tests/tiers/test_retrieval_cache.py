"""RetrievalCache end to end: lookup → forward misses → store, against qdrant-client local mode as the upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import numpy as np
import orjson
import pytest
from qdrant_client import QdrantClient, models
from qdrant_client.http import models as rest

from normalizer.search_request import Distance, parse_search
from tiers.memory import MemoryStore
from tiers.policies.lru import LRUPolicy
from tiers.redis_store import RedisStore
from tiers.retrieval import RetrievalCache, write_effects
from tiers.retrieval.batch import reassemble, response_bytes, split, upstream_body
from tiers.storage import KeyValueStore, StoreStats

DIM = 8
QUERY = "/collections/docs/points/query"
QUERY_BATCH = "/collections/docs/points/query/batch"
SEARCH_BATCH = "/collections/docs/points/search/batch"


class LocalQdrantUpstream:
    """Test double of the Qdrant server: answers REST search bodies with qdrant-client local mode."""

    def __init__(self, client: QdrantClient) -> None:
        self.client = client
        self.bodies: list[dict[str, Any]] = []

    def _points(self, collection: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        query = body.get("query", body.get("vector"))
        found = self.client.query_points(
            collection, query=query, limit=body.get("limit", 10), with_payload=body.get("with_payload", False)
        )
        return [point.model_dump(mode="json") for point in found.points]

    def post(self, path: str, body: dict[str, Any]) -> bytes:
        self.bodies.append(body)
        collection = path.split("/")[2]
        if path.endswith("/query"):
            result: Any = {"points": self._points(collection, body)}
        elif path.endswith("/query/batch"):
            result = [{"points": self._points(collection, s)} for s in body["searches"]]
        elif path.endswith("/search/batch"):
            result = [self._points(collection, s) for s in body["searches"]]
        else:
            result = self._points(collection, body)
        return orjson.dumps({"result": result, "status": "ok", "time": 0.001})


@pytest.fixture
def qdrant() -> QdrantClient:
    client = QdrantClient(":memory:")
    client.create_collection("docs", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    rng = np.random.default_rng(7)
    client.upsert(
        "docs",
        points=[models.PointStruct(id=i, vector=rng.normal(size=DIM).tolist(), payload={"n": i}) for i in range(60)],
    )
    return client


@pytest.fixture(params=["memory", "redis"])
async def results(request: pytest.FixtureRequest) -> AsyncIterator[KeyValueStore]:
    """The bytes store behind the cache: embedded (MemoryStore) and shared (RedisStore on the test Redis)."""
    if request.param == "memory":
        yield MemoryStore(LRUPolicy(10**8))
        return
    store = RedisStore(request.getfixturevalue("redis_url"), prefix="retrieval-test")
    yield store
    await store.close()


async def make_cache(qdrant: QdrantClient, results: KeyValueStore, tolerance: float = 0.05) -> RetrievalCache:
    cache = RetrievalCache(results, default_tolerance=tolerance)
    info = {"result": qdrant.get_collection("docs").model_dump(mode="json"), "status": "ok", "time": 0}
    assert await cache.learn_collection("docs", orjson.dumps(info)) == {"": Distance.COSINE}
    return cache


async def serve(cache: RetrievalCache, upstream: LocalQdrantUpstream, path: str, body: dict[str, Any]) -> bytes:
    """What the Qdrant route does: parse → lookup → forward misses → store."""
    request = parse_search(path, orjson.dumps(body))
    if request is None:
        return upstream.post(path, body)
    plan = await cache.lookup("tenant", request)
    if plan.complete:
        return plan.response()
    upstream_answer = upstream.post(path, plan.upstream_body(body))
    merged = await cache.store(plan, upstream_answer)
    assert merged is not None
    return merged


async def write(cache: RetrievalCache, method: str, path: str, body: dict[str, Any]) -> int:
    found = write_effects(method, path, orjson.dumps(body))
    assert len(found) == 1
    return await cache.invalidate(found[0])


def ids(points: Iterable[dict[str, Any]]) -> list[Any]:
    return [p["id"] for p in points]


def unit(rng: np.random.Generator) -> list[float]:
    v = rng.normal(size=DIM)
    values: list[float] = (v / np.linalg.norm(v)).tolist()
    return values


def nudge(vector: list[float], amount: float) -> list[float]:
    values: list[float] = (np.asarray(vector) + amount).tolist()
    return values


async def test_batch_is_answered_per_item_in_order(qdrant: QdrantClient, results: KeyValueStore) -> None:
    cache, upstream = await make_cache(qdrant, results), LocalQdrantUpstream(qdrant)
    rng = np.random.default_rng(1)
    q1, q2, q3, q4 = (unit(rng) for _ in range(4))
    first = orjson.loads(
        await serve(cache, upstream, QUERY_BATCH, {"searches": [{"query": q, "limit": 5} for q in (q1, q2, q3)]})
    )
    assert len(upstream.bodies[-1]["searches"]) == 3
    body = {
        "searches": [
            {"query": nudge(q1, 0.001), "limit": 5},
            {"query": q4, "limit": 5},
            {"query": q2, "limit": 5},
        ]
    }
    second = orjson.loads(await serve(cache, upstream, QUERY_BATCH, body))
    assert upstream.bodies[-1] == {"searches": [{"query": q4, "limit": 5}]}  # only the miss went upstream
    assert second["status"] == "ok" and len(second["result"]) == 3
    assert second["result"][0] == first["result"][0]  # approximate hit: q1's cached result
    assert second["result"][2] == first["result"][1]  # exact hit
    direct = qdrant.query_points("docs", query=q4, limit=5).points
    assert ids(second["result"][1]["points"]) == [p.id for p in direct]
    for result in second["result"]:  # what qdrant-client would parse
        rest.QueryResponse.model_validate(result)
    complete = await serve(cache, upstream, QUERY_BATCH, body)
    assert len(upstream.bodies) == 2 and orjson.loads(complete)["result"] == second["result"]


async def test_search_batch_shape_and_single_hits(qdrant: QdrantClient, results: KeyValueStore) -> None:
    cache, upstream = await make_cache(qdrant, results), LocalQdrantUpstream(qdrant)
    rng = np.random.default_rng(2)
    q = unit(rng)
    await serve(cache, upstream, SEARCH_BATCH, {"searches": [{"vector": q, "limit": 4}]})
    again = orjson.loads(
        await serve(cache, upstream, SEARCH_BATCH, {"searches": [{"vector": nudge(q, 1e-3), "limit": 4}]})
    )
    assert len(upstream.bodies) == 1
    assert ids(again["result"][0]) == [p.id for p in qdrant.query_points("docs", query=q, limit=4).points]
    single = orjson.loads(await serve(cache, upstream, QUERY, {"query": q, "limit": 4}))
    assert isinstance(single["result"], dict) and len(upstream.bodies) == 2  # other endpoint, other partition
    await serve(cache, upstream, QUERY, {"query": q, "limit": 4})
    assert len(upstream.bodies) == 2


async def test_far_vectors_and_other_parameters_miss(qdrant: QdrantClient, results: KeyValueStore) -> None:
    cache, upstream = await make_cache(qdrant, results, tolerance=0.01), LocalQdrantUpstream(qdrant)
    rng = np.random.default_rng(3)
    q = unit(rng)
    await serve(cache, upstream, QUERY, {"query": q, "limit": 4})
    await serve(cache, upstream, QUERY, {"query": unit(rng), "limit": 4})
    await serve(cache, upstream, QUERY, {"query": q, "limit": 4, "with_payload": True})
    assert len(upstream.bodies) == 3


async def test_deleting_a_point_drops_the_searches_that_returned_it(
    qdrant: QdrantClient, results: KeyValueStore
) -> None:
    cache, upstream = await make_cache(qdrant, results), LocalQdrantUpstream(qdrant)
    rng = np.random.default_rng(4)
    q, other = unit(rng), unit(rng)
    before = orjson.loads(await serve(cache, upstream, QUERY, {"query": q, "limit": 3}))["result"]["points"]
    other_ids = ids(orjson.loads(await serve(cache, upstream, QUERY, {"query": other, "limit": 3}))["result"]["points"])
    victim = next(i for i in ids(before) if i not in other_ids)
    qdrant.delete("docs", points_selector=models.PointIdsList(points=[victim]))
    assert await write(cache, "POST", "/collections/docs/points/delete", {"points": [victim]}) == 1
    after = orjson.loads(await serve(cache, upstream, QUERY, {"query": q, "limit": 3}))["result"]["points"]
    assert victim not in ids(after) and len(upstream.bodies) == 3
    await serve(cache, upstream, QUERY, {"query": other, "limit": 3})  # untouched search still cached
    assert len(upstream.bodies) == 3


async def test_upsert_drops_the_whole_collection(qdrant: QdrantClient, results: KeyValueStore) -> None:
    cache, upstream = await make_cache(qdrant, results), LocalQdrantUpstream(qdrant)
    rng = np.random.default_rng(5)
    q = unit(rng)
    await serve(cache, upstream, QUERY, {"query": q, "limit": 3})
    qdrant.upsert("docs", points=[models.PointStruct(id=1000, vector=q)])
    assert await write(cache, "PUT", "/collections/docs/points", {"points": [{"id": 1000, "vector": q}]}) == 1
    fresh = orjson.loads(await serve(cache, upstream, QUERY, {"query": q, "limit": 3}))["result"]["points"]
    assert fresh[0]["id"] == 1000
    assert (await cache.results.stats()).entries == 1


async def test_an_upstream_error_is_not_stored(qdrant: QdrantClient, results: KeyValueStore) -> None:
    cache = await make_cache(qdrant, results)
    request = parse_search(QUERY, orjson.dumps({"query": [0.1] * DIM, "limit": 3}))
    assert request is not None
    plan = await cache.lookup("tenant", request)
    error = orjson.dumps({"status": {"error": "Not found: Collection `docs` doesn't exist!"}, "time": 0.0})
    assert await cache.store(plan, error) is None
    assert len(cache.index) == 0


class BrokenStore:
    """Test double of a failing bytes store (a Redis that went away): every call raises."""

    name = "broken"

    async def get(self, key: str) -> bytes | None:
        raise ConnectionError("store down")

    async def put(self, key: str, value: bytes, **_: Any) -> bool:
        raise ConnectionError("store down")

    async def delete(self, key: str) -> bool:
        raise ConnectionError("store down")

    async def keys_with_tag(self, tag: str) -> list[str]:
        raise ConnectionError("store down")

    async def delete_tag(self, tag: str) -> int:
        raise ConnectionError("store down")

    async def clear(self) -> int:
        raise ConnectionError("store down")

    async def stats(self) -> StoreStats:
        raise ConnectionError("store down")

    async def close(self) -> None:
        return None


async def test_a_broken_store_fails_open(qdrant: QdrantClient) -> None:
    cache, upstream = RetrievalCache(BrokenStore()), LocalQdrantUpstream(qdrant)
    await cache.set_metric("docs", Distance.COSINE)
    q = [0.1] * DIM
    for _ in range(2):
        answer = orjson.loads(await serve(cache, upstream, QUERY, {"query": q, "limit": 3}))
        assert len(answer["result"]["points"]) == 3
    assert len(upstream.bodies) == 2 and len(cache.index) == 0


# -- batch helpers -------------------------------------------------------------------------------------------------


def test_split_and_reassemble_keep_request_order() -> None:
    answers = [b"a", None, b"c", None, None]
    parts = split(answers)
    assert parts.hits == (0, 2) and parts.misses == (1, 3, 4)
    body = {"searches": [{"n": i} for i in range(5)]}
    assert upstream_body(body, True, parts.misses) == {"searches": [{"n": 1}, {"n": 3}, {"n": 4}]}
    ordered = reassemble(5, {0: b"a", 2: b"c"}, [b"B", b"D", b"E"], parts.misses)
    assert ordered == [b"a", b"B", b"c", b"D", b"E"]
    assert orjson.loads(response_bytes([b"[1]", b"[]"], True, 0.5)) == {
        "result": [[1], []],
        "status": "ok",
        "time": 0.5,
    }
    with pytest.raises(ValueError):
        reassemble(3, {0: b"a"}, [b"b"], [1])


@pytest.mark.parametrize(("results", "dim"), [(1, 8), (10, 384), (100, 32), (256, 384)])
async def test_the_byte_budget_counts_what_cached_searches_hold(results: int, dim: int) -> None:
    """What the policy counts per cached search against what it holds (tracemalloc): its result, query vector, key,
    and the point ids it tracks for invalidation."""
    import gc
    import tracemalloc

    cache = RetrievalCache(capacity_bytes=10**9)
    await cache.set_metric("docs", Distance.COSINE)
    rng = np.random.default_rng(0)
    searches = [orjson.dumps({"vector": rng.standard_normal(dim).tolist(), "limit": results, "with_payload": True})
                for _ in range(100)]
    answers = [orjson.dumps({"result": [{"id": n * 1000 + i, "version": 0, "score": 0.9, "payload": {
        "title": f"point {i}", "text": "some payload text " * 4}} for i in range(results)], "status": "ok",
        "time": 0.001}) for n in range(100)]
    gc.collect()
    tracemalloc.start()
    try:
        for search, answer in zip(searches, answers, strict=True):
            request = parse_search("/collections/docs/points/search", search)
            assert request is not None
            await cache.store(await cache.lookup("tenant", request), answer)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    [account] = cache.memory()
    assert account.entries == 100 and account.bytes == cache.index.policy.used
    assert 0.8 <= held / account.bytes <= 1.25, (held, account.bytes)
