"""Invalidating a document removes every cached answer whose prompt carried it (the document reverse index)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"


def _ask(server: ProxyServer, doc_ids: list[str], question: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": question}],
                            "ragproxy": {"documents": [{"id": i, "text": f"text of {i}"} for i in doc_ids]}}
    return httpx.post(server.url + CHAT, json=body)


def test_invalidating_a_document_drops_answers_that_used_it(fake_llm_thread: FakeLLM) -> None:
    with ProxyServer(proxy_settings(fake_llm_thread.url, **{"cache.l3.enabled": False}), admin=True) as server:
        _ask(server, ["a", "b"], "q1")
        _ask(server, ["c"], "q2")
        assert _ask(server, ["a", "b"], "q1").headers["X-Cache-Status"] == "HIT"
        removed = httpx.post(server.admin_url + "/admin/invalidate", json={"documents": ["b"]}).json()
        assert removed["removed"]["l1"] == 1, removed
        assert _ask(server, ["a", "b"], "q1").headers["X-Cache-Status"] == "MISS"
        assert _ask(server, ["c"], "q2").headers["X-Cache-Status"] == "HIT"
        assert fake_llm_thread.log.count(CHAT) == 3
