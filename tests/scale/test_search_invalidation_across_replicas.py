"""Three replicas on one Redis, each with its own cached Qdrant searches: a write through one replica, the
``X-Cache-Invalidate`` header and the admin call drop the collection's cached searches on all of them before
they return (httpx over loopback; the Qdrant shim as the upstream)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.proxy.test_search_staleness import QUERY, SEARCH, delete_directly, seed
from tests.scale.replicas import shared_replicas
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


def statuses(servers: list[ProxyServer]) -> list[tuple[str, list[int]]]:
    answers = [httpx.post(s.url + SEARCH, json=QUERY, timeout=30) for s in servers]
    return [(a.headers["X-Cache-Status"], [hit["id"] for hit in a.json()["result"]]) for a in answers]


def through_a_write(servers: list[ProxyServer], shim: QdrantShim) -> None:
    httpx.post(servers[0].url + "/collections/docs/points/delete?wait=true", json={"points": [0]},
               timeout=30).raise_for_status()


def by_header(servers: list[ProxyServer], shim: QdrantShim) -> None:
    delete_directly(shim, 0)
    reply = httpx.post(servers[0].url + SEARCH, json=QUERY, headers={"X-Cache-Invalidate": "collection"}, timeout=30)
    assert reply.headers["X-Cache-Invalidated"] == "1"


def by_admin(servers: list[ProxyServer], shim: QdrantShim) -> None:
    delete_directly(shim, 0)
    reply = httpx.post(servers[1].admin_url + "/admin/invalidate", json={"collection": "docs"}, timeout=30)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("invalidate", [through_a_write, by_header, by_admin])
def test_a_collection_invalidation_reaches_every_replica(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim,
                                                        redis_url: str,
                                                        invalidate: Callable[[list[ProxyServer], QdrantShim], None]
                                                        ) -> None:
    seed(qdrant_shim.url)
    with shared_replicas(3, fake_llm_thread.url, redis_url, **{"upstreams.qdrant.url": qdrant_shim.url}) as servers:
        assert statuses(servers) == [("MISS", [0, 1, 2])] * 3
        assert statuses(servers) == [("HIT", [0, 1, 2])] * 3
        invalidate(servers, qdrant_shim)
        fresh = statuses(servers[1:] if invalidate is by_header else servers)
        assert all(ids == [1, 2, 3] for _, ids in fresh), fresh
