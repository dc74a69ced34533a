"""With shared mode, a proxy replica routes by what every replica sent to each backend, not only its own traffic."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM

DOCS = [{"id": f"doc{i}", "text": f"Passage {i}: " + " ".join(f"w{i}_{j}" for j in range(150))} for i in range(3)]


def _ask(server: ProxyServer, question: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": question}],
                            "ragproxy": {"documents": DOCS}}
    return httpx.post(server.url + "/v1/chat/completions", json=body)


def test_second_proxy_follows_the_backend_the_first_one_filled(redis_url: str) -> None:
    with FakeLLM(kv=KVCacheModel()) as a, FakeLLM(kv=KVCacheModel()) as b:
        def settings() -> Any:
            return proxy_settings(**{"upstreams.llm": [{"url": a.url}, {"url": b.url}], "cache.enabled": False,
                                     "redis.url": redis_url, "routing.expose_headers": True})
        with ProxyServer(settings()) as first, ProxyServer(settings()) as second:
            assert first.runtime.shared is not None and second.runtime.shared is not None
            chosen = _ask(first, "question one").headers["X-RagProxy-Replica"]
            assert second.runtime.kv is not None and second.runtime.kv.replicas[0].tree.size_tokens == 0
            first.call(first.runtime.shared.board.publish())
            second.call(second.runtime.shared.board.refresh())
            follow = _ask(second, "question two")
            assert follow.headers["X-RagProxy-Replica"] == chosen
            # the second proxy never sent these documents itself: its estimate comes from the first one's summary
            assert int(follow.headers["X-RagProxy-Cached-Tokens-Estimate"]) > 300
