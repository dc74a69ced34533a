"""Cached searches never outlive a change made directly in Qdrant for long: a bounded default lifetime, the
``X-Cache-Invalidate: collection`` header and the admin call (real proxy and admin app over loopback HTTP, the
Qdrant shim as the upstream; points deleted straight in the shim, as an ingestion job does in Qdrant)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.search.tier import SearchTier
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.qdrant_shim import QdrantShim

SEARCH = "/collections/docs/points/search"
QUERY = {"vector": [1.0, 0.0, 0.5, 0.25], "limit": 3}


def seed(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        http.put("/collections/docs", json={"vectors": {"size": 4, "distance": "Cosine"}}).raise_for_status()
        points = [{"id": n, "vector": [1.0, float(n), 0.5, 0.25]} for n in range(6)]
        http.put("/collections/docs/points?wait=true", json={"points": points}).raise_for_status()


def delete_directly(shim: QdrantShim, point: int) -> None:
    httpx.post(shim.url + "/collections/docs/points/delete?wait=true", json={"points": [point]}).raise_for_status()


def search(server: ProxyServer, **headers: str) -> tuple[str, list[Any]]:
    response = httpx.post(server.url + SEARCH, json=QUERY, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.headers["X-Cache-Status"], [hit["id"] for hit in response.json()["result"]]


@pytest.fixture
def proxy(qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[ProxyServer]:
    seed(qdrant_shim.url)
    with ProxyServer(proxy_settings(None, qdrant_shim.url, data_dir=str(tmp_path)), admin=True) as server:
        yield server


def test_cached_searches_expire_by_default(proxy: ProxyServer) -> None:
    tier = proxy.runtime.tiers.find(SearchTier)
    assert tier is not None
    assert tier.cache.ttl == proxy.settings.cache.retrieval.ttl_s == 300.0


def test_a_deleted_point_stops_coming_back_once_the_lifetime_ends(qdrant_shim: QdrantShim, tmp_path: Path) -> None:
    seed(qdrant_shim.url)
    settings = proxy_settings(None, qdrant_shim.url, data_dir=str(tmp_path), **{"cache.retrieval.ttl_s": 3.0})
    with ProxyServer(settings) as server:
        assert search(server) == ("MISS", [0, 1, 2])
        stored = time.monotonic()  # a lifetime of 3 s: room for a loaded machine before the stale hit
        delete_directly(qdrant_shim, 0)
        assert search(server) == ("HIT", [0, 1, 2]), "stale within its lifetime: the trade-off of the TTL"
        time.sleep(max(0.0, stored + 3.1 - time.monotonic()))
        assert search(server) == ("MISS", [1, 2, 3])


def test_the_invalidate_header_drops_the_collection_s_cached_searches(qdrant_shim: QdrantShim,
                                                                      proxy: ProxyServer) -> None:
    assert search(proxy) == ("MISS", [0, 1, 2])
    delete_directly(qdrant_shim, 0)
    response = httpx.post(proxy.url + SEARCH, json=QUERY, headers={"X-Cache-Invalidate": "collection"}, timeout=30)
    assert response.headers["X-Cache-Status"] == "MISS" and response.headers["X-Cache-Invalidated"] == "1"
    assert [hit["id"] for hit in response.json()["result"]] == [1, 2, 3]
    assert search(proxy) == ("HIT", [1, 2, 3])


def test_the_invalidate_header_on_a_write_of_another_collection_keeps_these(qdrant_shim: QdrantShim,
                                                                           proxy: ProxyServer) -> None:
    assert search(proxy)[0] == "MISS"
    httpx.put(proxy.url + "/collections/other", json={"vectors": {"size": 4, "distance": "Cosine"}},
              headers={"X-Cache-Invalidate": "collection"}, timeout=30).raise_for_status()
    assert search(proxy)[0] == "HIT"


def test_the_admin_call_drops_the_collection_s_cached_searches(qdrant_shim: QdrantShim, proxy: ProxyServer) -> None:
    assert search(proxy) == ("MISS", [0, 1, 2])
    delete_directly(qdrant_shim, 0)
    removed = httpx.post(proxy.admin_url + "/admin/invalidate", json={"collection": "docs"}, timeout=30)
    assert removed.status_code == 200 and removed.json()["removed"]["retrieval"] == 1
    assert search(proxy) == ("MISS", [1, 2, 3])
