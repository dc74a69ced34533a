"""Every metric the proxy declares is recorded: after traffic that exercises each, every family scraped from
``/metrics`` has samples (a declared metric that nothing records is a dashboard that stays empty)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.admin.conftest import TOKEN, Admin
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
DOCUMENTS = [{"id": f"d{i}", "text": f"passage {i} " + "words of the passage " * 40} for i in range(3)]


def _ask(server: ProxyServer, key: str, question: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": question}],
                            "ragproxy": {"documents": DOCUMENTS}}
    response = httpx.post(server.url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response


def test_every_declared_metric_has_samples_after_traffic(tmp_path: Any) -> None:
    with FakeLLM(kv=KVCacheModel(), latency_s=0.3) as llm, ProxyServer(proxy_settings(llm.url, **{
            "admin.token": TOKEN, "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path)}),
            admin=True) as server:
        admin, backend = Admin(server), llm.url
        key = admin.post("/admin/keys", json={"user": "alice", "tenant": "acme"}).json()["key"]
        admin.post("/admin/credits/alice", json={"amount": "100", "tenant": "acme"})
        _ask(server, key, "first question")  # a miss: the backend caches the documents' prefix
        _ask(server, key, "second question")  # the prefix reported as reused
        _ask(server, key, "first question")  # an L1 hit
        with ThreadPoolExecutor(4) as pool:  # identical concurrent misses: one upstream call, three coalesced
            list(pool.map(lambda _: _ask(server, key, "third question"), range(4)))
        families = {f.name: f for f in text_string_to_metric_families(admin.get("/metrics").text)}
        admin.client.close()
    empty = sorted(name for name, family in families.items() if not family.samples)
    assert empty == []
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("ragproxy_cache_lookups_total", (("result", "hit"), ("tier", "l1")))] >= 1
    assert samples[("ragproxy_cache_lookups_total", (("result", "miss"), ("tier", "l1")))] >= 2
    assert samples[("ragproxy_cache_lookup_duration_seconds_count", (("tier", "l1"),))] >= 3
    assert samples[("ragproxy_cache_events_total", (("event", "coalesced"), ("tier", "coalesce")))] >= 1
    assert samples[("ragproxy_kv_cached_prompt_tokens_total", (("backend", backend),))] > 0
