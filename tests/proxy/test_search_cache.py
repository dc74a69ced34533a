"""The vector-search cache through HTTP, with qdrant-client and raw REST against the Qdrant shim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from qdrant_client import QdrantClient, models

from proxy.search.tenancy import namespace_of
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.qdrant_shim import QdrantShim

VECTOR = [0.9, 0.1, 0.3, 0.2]
NEARBY = [0.9, 0.1, 0.3, 0.2005]
FAR = [-0.2, 0.9, 0.1, 0.4]


def _seed(proxy: ProxyServer) -> QdrantClient:
    client = QdrantClient(url=proxy.url, prefer_grpc=False, check_compatibility=False)
    client.create_collection("docs", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
    client.upsert("docs", points=[
        models.PointStruct(id=i, vector=[1.0, i / 10, (i % 3) / 3, ((i * 7) % 5) / 5], payload={"text": f"passage {i}"})
        for i in range(1, 31)
    ])
    return client


def _query(proxy: ProxyServer, vector: list[float], headers: dict[str, str] | None = None,
           **extra: Any) -> httpx.Response:
    return httpx.post(proxy.url + "/collections/docs/points/query", headers=headers,
                      json={"query": vector, "limit": 5, "with_payload": True, **extra})


def _searches(shim: QdrantShim) -> int:
    return shim.log.count("/collections/docs/points/query") + shim.log.count("/collections/docs/points/query/batch")


def test_repeat_and_nearby_vectors_are_served_from_cache(qdrant_shim: QdrantShim, caching_proxy: ProxyServer) -> None:
    client = _seed(caching_proxy)
    first = _query(caching_proxy, VECTOR)
    assert first.headers["X-Cache-Status"] == "MISS"
    repeat = _query(caching_proxy, VECTOR)
    assert repeat.headers["X-Cache-Status"] == "HIT"
    assert repeat.json()["result"] == first.json()["result"]
    nearby = _query(caching_proxy, NEARBY)
    assert nearby.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert [p["id"] for p in nearby.json()["result"]["points"]] == [p["id"] for p in first.json()["result"]["points"]]
    assert _query(caching_proxy, FAR).headers["X-Cache-Status"] == "MISS"
    different_limit = _query(caching_proxy, VECTOR, limit=3)
    assert different_limit.headers["X-Cache-Status"] == "MISS", "everything but the vector must match exactly"
    assert _searches(qdrant_shim) == 3
    via_sdk = client.query_points("docs", query=VECTOR, limit=5, with_payload=True).points
    assert [p.id for p in via_sdk] == [p["id"] for p in first.json()["result"]["points"]]
    assert _searches(qdrant_shim) == 3, "the SDK's identical search is a hit too"


def test_writes_invalidate(qdrant_shim: QdrantShim, caching_proxy: ProxyServer) -> None:
    client = _seed(caching_proxy)
    _query(caching_proxy, VECTOR)
    client.upsert("docs", points=[models.PointStruct(id=99, vector=VECTOR, payload={"text": "new and exact"})])
    after = _query(caching_proxy, VECTOR)
    assert after.headers["X-Cache-Status"] == "MISS"
    assert after.json()["result"]["points"][0]["id"] == 99, "a write is never hidden by the cache"
    client.delete("docs", points_selector=models.PointIdsList(points=[99]))
    assert 99 not in [p["id"] for p in _query(caching_proxy, VECTOR).json()["result"]["points"]]


def test_batch_forwards_only_missing_items(qdrant_shim: QdrantShim, caching_proxy: ProxyServer) -> None:
    _seed(caching_proxy)
    single = _query(caching_proxy, VECTOR).json()["result"]["points"]
    batch = httpx.post(caching_proxy.url + "/collections/docs/points/query/batch", json={"searches": [
        {"query": FAR, "limit": 5, "with_payload": True},
        {"query": VECTOR, "limit": 5, "with_payload": True},
    ]})
    assert batch.status_code == 200
    assert batch.headers["X-Cache-Hits"] == "1/2"
    results = batch.json()["result"]
    assert results[1]["points"] == single
    forwarded = qdrant_shim.log.for_path("/collections/docs/points/query/batch")[-1].json()["searches"]
    assert len(forwarded) == 1 and forwarded[0]["query"] == FAR
    direct = QdrantClient(url=qdrant_shim.url, prefer_grpc=False, check_compatibility=False)
    expected = direct.query_points("docs", query=FAR, limit=5, with_payload=True).points
    assert [p["id"] for p in results[0]["points"]] == [p.id for p in expected]


def test_tenants_do_not_share_search_results(qdrant_shim: QdrantShim, tmp_path: Path) -> None:
    """Not even of a collection both may read (made outside the proxy, shared with every tenant)."""
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{"auth.mode": "keys", "data_dir": str(tmp_path),
                                                             "upstreams.qdrant.collections": {"docs": {"read": ["*"]}}})
    with ProxyServer(settings) as server:
        keys = server.runtime.credits.keys
        assert keys is not None
        alice, bob = (server.call(keys.create(user, tenant)).plaintext
                      for user, tenant in (("a", "acme"), ("b", "globex")))
        qdrant_shim.client.create_collection("docs", vectors_config=models.VectorParams(
            size=4, distance=models.Distance.COSINE))
        qdrant_shim.client.upsert("docs", points=[models.PointStruct(id=1, vector=VECTOR, payload={"t": "x"})])

        def query(key: str) -> str:
            return _query(server, VECTOR, headers={"Authorization": f"Bearer {key}"}).headers["X-Cache-Status"]

        assert query(alice) == "MISS"
        assert query(bob) == "MISS", "another tenant never reuses a cached search"
        assert query(alice) == "HIT"


def test_one_collection_name_in_two_tenants_is_two_collections_to_the_cache(qdrant_shim: QdrantShim,
                                                                            tmp_path: Path) -> None:
    """Cached searches are keyed, and writes invalidate, by upstream collection: a tenant's write never drops another
    tenant's cached searches of its own collection of the same name."""
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{"auth.mode": "keys", "data_dir": str(tmp_path)})
    with ProxyServer(settings) as server:
        keys = server.runtime.credits.keys
        assert keys is not None
        headers = {who: {"api-key": server.call(keys.create(f"{who}-user", f"tenant-{who}")).plaintext}
                   for who in "ab"}
        for who, payload in (("a", "A's text"), ("b", "B's text")):
            assert httpx.put(server.url + "/collections/docs", headers=headers[who],
                             json={"vectors": {"size": 4, "distance": "Cosine"}}).status_code == 200
            assert httpx.put(server.url + "/collections/docs/points?wait=true", headers=headers[who], json={
                "points": [{"id": 1, "vector": VECTOR, "payload": {"t": payload}}]}).status_code == 200

        def query(who: str) -> tuple[str, str]:
            answer = _query(server, VECTOR, headers=headers[who])
            return answer.headers["X-Cache-Status"], answer.json()["result"]["points"][0]["payload"]["t"]

        assert query("a") == ("MISS", "A's text") and query("b") == ("MISS", "B's text")
        assert query("a") == ("HIT", "A's text") and query("b") == ("HIT", "B's text")
        tier = next(tier for tier in server.runtime.tiers if tier.name == "retrieval")
        assert sorted(tier.cache.collections()) == sorted(  # type: ignore[attr-defined]
            namespace_of(f"tenant-{who}") + "docs" for who in "ab")
        httpx.put(server.url + "/collections/docs/points?wait=true", headers=headers["a"], json={
            "points": [{"id": 2, "vector": FAR, "payload": {"t": "A's second"}}]}).raise_for_status()
        assert query("a") == ("MISS", "A's text"), "A's write drops A's cached search"
        assert query("b") == ("HIT", "B's text"), "and not B's, of B's own docs"
