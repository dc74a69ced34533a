"""Admin cache routes through HTTP against a running proxy: stats, entries, invalidation by every selector,
version bump, flush, LiteLLM aliases and ``/metrics``."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.admin.conftest import Admin, ask, only_key
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM


def status(response: object) -> str:
    return response.headers["X-Cache-Status"]  # type: ignore[attr-defined, no-any-return]


def nonzero(removed: dict[str, int]) -> dict[str, int]:
    """Counts of the tiers that lost something (tiers the runtime gains later report 0 here)."""
    return {tier: count for tier, count in removed.items() if count}


def test_stats_count_requests_hits_and_cost(admin_proxy: ProxyServer, admin: Admin) -> None:
    ask(admin_proxy, "q1")
    ask(admin_proxy, "q1")
    ask(admin_proxy, "q1")
    ask(admin_proxy, "q2", n=2)  # uncacheable: a bypass
    stats = admin.get("/admin/stats").json()
    assert stats["total"] | {"hit_ratio": 0, "cost_saved_s": 0} == {
        "requests": 4, "hits": 2, "misses": 1, "bypasses": 1, "errors": 0, "hit_ratio": 0, "cost_saved_s": 0}
    assert stats["total"]["hit_ratio"] == pytest.approx(2 / 3, abs=1e-6)
    assert stats["routes"]["chat"]["requests"] == 4
    assert stats["served_by_tier"]["l1"]["hits"] == 2
    entry = admin.get("/admin/entries").json()["entries"][0]
    assert stats["cost_saved_s"] == pytest.approx(2 * entry["cost_s"], abs=1e-5), "two hits of one entry"
    l1 = stats["tiers"]["l1"]
    assert l1["entries"] == 1 and l1["bytes"] > 0 and l1["lookups"]["hits"] == 2
    assert stats["top_entries"][0]["key"] == entry["key"] and stats["top_entries"][0]["hits"] == 2
    assert stats["top_entries"][0]["question"] == entry["question"] == "q1", "an exact hit's row names its question"
    assert set(stats["latency_s"]) >= {"HIT", "MISS"} and stats["latency_s"]["HIT"]["count"] == 2
    assert sum(b["requests"] for b in stats["series"]["buckets"]) == 4


def test_entries_filter_paginate_show_delete(admin_proxy: ProxyServer, admin: Admin) -> None:
    first = ask(admin_proxy, "question 0", namespace="alpha")
    for i in range(1, 5):
        ask(admin_proxy, f"question {i}", namespace="alpha")
    report = {"ragproxy": {"documents": [{"id": "doc-9", "text": "The Beta report, by the audit team."}]}}
    ask(admin_proxy, "Who wrote the Beta report?", namespace="beta", **report)
    ask(admin_proxy, "model two", model="other-model")
    assert len(admin.get("/admin/entries", params={"namespace": "alpha"}).json()["entries"]) == 5
    assert len(admin.get("/admin/entries", params={"model": "other-model"}).json()["entries"]) == 1
    assert admin.get("/admin/entries", params={"tenant": "nobody"}).json()["entries"] == []
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        page = admin.get("/admin/entries", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen.extend(e["key"] for e in page["entries"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 7 and len(set(seen)) == 7 and seen == sorted(seen)
    assert admin.get("/admin/entries", params={"limit": 501}).status_code == 400
    assert admin.get("/admin/entries", params={"cursor": "%%%"}).status_code == 400
    key = only_key(admin, namespace="beta")
    assert [e["key"] for e in admin.get("/admin/entries", params={"q": "beta REPORT"}).json()["entries"]] == [key]
    assert [e["key"] for e in admin.get("/admin/entries", params={"doc": "doc-9"}).json()["entries"]] == [key]
    assert admin.get("/admin/entries", params={"min_age_s": 3600}).json()["entries"] == []
    alpha0 = [e for e in admin.get("/admin/entries", params={"namespace": "alpha"}).json()["entries"]]
    detail = admin.get(f"/admin/entries/{alpha0[0]['key']}").json()
    assert detail["meta"]["namespace"] == "alpha" and detail["tiers"] == ["l1"]
    bodies = {e["key"]: admin.get(f"/admin/entries/{e['key']}").json()["body"] for e in alpha0}
    assert first.json() in bodies.values(), "the decoded body is the answer the client got"
    assert admin.delete(f"/admin/entries/{key}").json() == {"removed": {"l1": 1}, "total": 1}
    assert admin.delete(f"/admin/entries/{key}").status_code == 404
    assert admin.get(f"/admin/entries/{key}").status_code == 404
    assert status(ask(admin_proxy, "Who wrote the Beta report?", namespace="beta", **report)) == "MISS"


@pytest.mark.parametrize("selector", ["keys", "tenant+namespace", "namespace", "model", "documents", "age"])
def test_invalidate_selector_makes_next_request_miss(admin_proxy: ProxyServer, admin: Admin,
                                                     selector: str) -> None:
    documents = {"ragproxy": {"documents": [{"id": "doc-1", "text": "one"}, {"id": "doc-2", "text": "two"}]}}
    ask(admin_proxy, "target", namespace="ns-a", model="fake-model", **documents)
    if selector == "age":
        time.sleep(1.2)
    ask(admin_proxy, "bystander", namespace="ns-b", model="other-model")
    target = only_key(admin, namespace="ns-a")
    body = {
        "keys": {"keys": [target]},
        "tenant+namespace": {"tenant": "anonymous", "namespace": "ns-a"},
        "namespace": {"namespace": "ns-a"},
        "model": {"model": "fake-model"},
        "documents": {"documents": ["doc-2", "doc-unknown"]},
        "age": {"older_than_s": 1.0},
    }[selector]
    result = admin.post("/admin/invalidate", json=body).json()
    assert nonzero(result["removed"]) == {"l1": 1} and result["total"] == 1
    assert status(ask(admin_proxy, "target", namespace="ns-a", model="fake-model", **documents)) == "MISS"
    assert status(ask(admin_proxy, "bystander", namespace="ns-b", model="other-model")) == "HIT"


def test_selectors_combine_with_and(admin_proxy: ProxyServer, admin: Admin) -> None:
    ask(admin_proxy, "x", namespace="ns-a")
    assert admin.post("/admin/invalidate", json={"namespace": "ns-a", "model": "other-model"}).json()["total"] == 0
    assert admin.post("/admin/invalidate", json={"tenant": "someone-else", "namespace": "ns-a"}).json()["total"] == 0
    assert status(ask(admin_proxy, "x", namespace="ns-a")) == "HIT"
    assert admin.post("/admin/invalidate", json={"namespace": "ns-a", "model": "fake-model"}).json()["total"] == 1


@pytest.mark.parametrize(("body", "code"), [
    ({}, "empty_selector"),
    ({"near": {"text": "what is rag", "radius": 0.2}}, "invalid_selector"),  # no semantic tier in this runtime
    ({"older_than_s": -1}, "invalid_request"),
    ({"unknown": 1}, "invalid_request"),
])
def test_invalidate_rejects(admin: Admin, body: dict[str, object], code: str) -> None:
    response = admin.post("/admin/invalidate", json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert admin.post("/admin/invalidate", content=b"[1]").status_code == 400


def test_collection_and_documents_drop_cached_searches(admin_proxy: ProxyServer, admin: Admin) -> None:
    qdrant = httpx.Client(base_url=admin_proxy.url, timeout=30)
    assert qdrant.put("/collections/docs", json={"vectors": {"size": 4, "distance": "Cosine"}}).status_code == 200
    points = [{"id": 7, "vector": [1, 0, 0, 0], "payload": {"text": "seven"}},
              {"id": 8, "vector": [0, 1, 0, 0], "payload": {"text": "eight"}}]
    assert qdrant.put("/collections/docs/points?wait=true", json={"points": points}).status_code == 200

    def search(vector: list[float]) -> str:
        response = qdrant.post("/collections/docs/points/search", json={"vector": vector, "limit": 1})
        assert response.status_code == 200, response.text
        return status(response)

    ask(admin_proxy, "an answer")
    search([1, 0, 0, 0.1])
    search([0, 1, 0, 0.1])
    assert search([1, 0, 0, 0.1]) == "HIT" and search([0, 1, 0, 0.1]) == "HIT"
    by_doc = admin.post("/admin/invalidate", json={"documents": ["7"], "collection": "docs"}).json()
    assert by_doc["removed"]["retrieval"] >= 1 and by_doc["removed"]["l1"] == 0
    assert search([1, 0, 0, 0.1]) == "MISS", "the search whose result held point 7 is gone"
    by_collection = admin.post("/admin/invalidate", json={"collection": "docs"}).json()
    assert by_collection["removed"]["retrieval"] >= 1 and by_collection["removed"]["l1"] == 0
    assert search([0, 1, 0, 0.1]) == "MISS"
    assert status(ask(admin_proxy, "an answer")) == "HIT", "answers carry no collection tag: they stay"
    assert search([1, 0, 0, 0.1]) == "MISS" and search([1, 0, 0, 0.1]) == "HIT"
    without_collection = admin.post("/admin/invalidate", json={"documents": ["7"]}).json()
    assert without_collection["removed"]["retrieval"] >= 1, "a document is looked for in every cached collection"
    assert search([1, 0, 0, 0.1]) == "MISS"
    qdrant.close()


def test_version_bump_hides_older_entries(fake_llm_thread: FakeLLM, admin_proxy: ProxyServer,
                                          admin: Admin) -> None:
    ask(admin_proxy, "v", namespace="kb")
    ask(admin_proxy, "v", namespace="other")
    bumped = admin.post("/admin/versions/bump", json={"tenant": "anonymous", "namespace": "kb"}).json()
    assert bumped == {"tenant": "anonymous", "namespace": "kb", "version": "1"}
    assert status(ask(admin_proxy, "v", namespace="kb")) == "MISS"
    assert status(ask(admin_proxy, "v", namespace="kb")) == "HIT"
    assert status(ask(admin_proxy, "v", namespace="other")) == "HIT"
    assert admin.post("/admin/versions/bump", json={"tenant": "anonymous"}).status_code == 400


def test_flush(admin_proxy: ProxyServer, admin: Admin) -> None:
    ask(admin_proxy, "a")
    ask(admin_proxy, "b")
    assert admin.post("/admin/flush", json={"tiers": ["l1"]}).json() == {"removed": {"l1": 2}, "total": 2}
    assert status(ask(admin_proxy, "a")) == "MISS"
    assert nonzero(admin.post("/admin/flush").json()["removed"]) == {"l1": 1}
    response = admin.post("/admin/flush", json={"tiers": ["l9"]})
    assert response.status_code == 400 and "l9" in response.json()["error"]["message"]


def test_litellm_aliases(admin_proxy: ProxyServer, admin: Admin) -> None:
    ask(admin_proxy, "a")
    ask(admin_proxy, "b")
    key = admin.get("/admin/entries", params={"limit": 1}).json()["entries"][0]["key"]
    assert admin.post("/cache/delete", json={"keys": [key, "missing"]}).json() == {
        "status": "success", "deleted": 1, "removed": {"l1": 1}}
    flushed = admin.post("/cache/flushall").json()
    assert flushed["status"] == "success" and nonzero(flushed["removed"]) == {"l1": 1}
    assert status(ask(admin_proxy, "a")) == "MISS" and status(ask(admin_proxy, "b")) == "MISS"
    ping = admin.get("/cache/ping").json()
    assert ping["status"] == "healthy" and ping["tiers"] == [t.name for t in admin_proxy.runtime.tiers]
    assert set(ping["tiers"]) | set(ping["off"]) == {"l1", "l3", "l2", "retrieval"}, "every registered tier"


def test_metrics_exposition(admin_proxy: ProxyServer, admin: Admin) -> None:
    ask(admin_proxy, "m")
    ask(admin_proxy, "m")
    response = admin.get("/metrics")
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.text
    assert 'ragproxy_requests_total{cache_status="HIT",route="chat",status="200"} 1.0' in text
    assert 'ragproxy_cache_entries{tier="l1"} 1.0' in text
    assert 'ragproxy_cost_saved_seconds_total{tier="l1"}' in text
    assert "ragproxy_backend_up{" in text and "ragproxy_request_duration_seconds_bucket{" in text


def test_backends(admin: Admin, fake_llm_thread: FakeLLM) -> None:
    data = admin.get("/admin/backends").json()
    [tree] = data["knowledge_tree"]["summary"]
    assert tree["replica"] == 0 and tree["tree_capacity_tokens"] > 0 and tree["in_flight"] == 0
    [backend] = data["backends"]
    assert backend["url"] == fake_llm_thread.url and backend["healthy"] is True and backend["in_flight"] == 0


def test_cold_tier_is_listed_invalidated_and_flushed(tiered_proxy: ProxyServer) -> None:
    admin = Admin(tiered_proxy)
    ask(tiered_proxy, "cold", namespace="c")
    ask(tiered_proxy, "warm", namespace="w")
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while time.monotonic() < deadline:  # the cold copy is written behind the response
        entries = admin.get("/admin/entries").json()["entries"]
        if len(entries) == 2 and all(e["tiers"] == ["l1", "l3"] for e in entries):
            break
        time.sleep(0.1)
    assert all(e["tiers"] == ["l1", "l3"] for e in admin.get("/admin/entries").json()["entries"])
    assert admin.get("/admin/entries", params={"tier": "l3"}).json()["entries"]
    tiers = admin.get("/admin/stats").json()["tiers"]
    assert list(tiers) == ["l1", "l3", "retrieval"], "every registered tier, in lookup order"
    assert tiers["l3"]["write_behind"] == {"offered": 2, "written": 2, "dropped": 0, "failed": 0}
    assert tiers["l1"]["breaker"] == {"state": "closed", "opened": 0} and tiers["l1"]["expired"] == 0
    result = admin.post("/admin/invalidate", json={"namespace": "c"}).json()
    assert result["removed"] == {"l1": 1, "l3": 1}
    assert status(ask(tiered_proxy, "cold", namespace="c")) == "MISS"
    assert admin.post("/admin/flush", json={"tiers": ["l3"]}).json()["removed"]["l3"] >= 1
    assert status(ask(tiered_proxy, "warm", namespace="w")) == "HIT", "L1 keeps what only L3 lost"
    admin.client.close()
