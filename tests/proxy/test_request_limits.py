"""Large and deep inputs get an answer at once: a 400/413 in the route's own error shape for what exceeds the
documented limits (``limits.*``), never a 500, a hang or a body the upstream cannot take (raw JSON bodies over
loopback HTTP; the fake LLM and the Qdrant shim behind the proxy)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

CHAT = "/v1/chat/completions"
SEARCH = "/collections/docs/points/search"


@pytest.fixture
def server(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{"server.max_body_bytes": 64 * 1024 * 1024,
                                                                         "cache.l3.enabled": False})
    with ProxyServer(settings) as proxy:
        http = httpx.Client(base_url=proxy.url, timeout=30)
        http.put("/collections/docs", json={"vectors": {"size": 4, "distance": "Cosine"}}).raise_for_status()
        http.put("/collections/docs/points", json={"points": [
            {"id": n, "vector": [1.0, n, 0.5, 0.25], "payload": {"text": f"passage {n}"}} for n in range(20)]})
        yield proxy


def _post(server: ProxyServer, path: str, text: str) -> httpx.Response:
    """POST a JSON body given as text (deep values are beyond what Python's json and orjson would encode)."""
    return httpx.post(server.url + path, content=text.encode(), headers={"Content-Type": "application/json"},
                      timeout=30)


def _nested(depth: int, leaf: str = '"x"') -> str:
    return '{"a":' * depth + leaf + "}" * depth


def _openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text[:300]
    assert response.json()["error"]["code"] == code


def _qdrant_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:300]
    return str(response.json()["status"]["error"])


@pytest.mark.parametrize("where", ["tool parameters", "content part"])
def test_1000_deep_nesting_in_a_chat_request_is_a_400(fake_llm_thread: FakeLLM, server: ProxyServer,
                                                      where: str) -> None:
    deep = _nested(1000)
    if where == "tool parameters":
        text = ('{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
                '"function", "function": {"name": "f", "parameters": ' + deep + "}}]}")
    else:
        text = ('{"model": "fake-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", '
                '"extra": ' + deep + "}]}]}")
    _openai_error(_post(server, CHAT, text), 400, "nesting_too_deep")
    assert fake_llm_thread.log.count(CHAT) == 0


@pytest.mark.parametrize("path", [CHAT, "/v1/models", SEARCH])
def test_5000_deep_nesting_is_called_too_deep_not_invalid(fake_llm_thread: FakeLLM, server: ProxyServer,
                                                          path: str) -> None:
    """Past the JSON parser's own limit (1,024 levels) a body is as much too deep as one past ``limits.json_depth``:
    it is said so, not called invalid JSON."""
    text = '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "x": ' + _nested(5000) + "}"
    answer = httpx.request("GET" if path == "/v1/models" else "POST", server.url + path, content=text.encode(),
                           headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    message = answer.json()["status"]["error"] if path == SEARCH else answer.json()["error"]["message"]
    assert "nests too deeply" in message and "not valid JSON" not in message
    if path != SEARCH:
        assert answer.json()["error"]["code"] == "nesting_too_deep"
    assert fake_llm_thread.log.count(CHAT) == 0


def test_nesting_within_the_limit_is_served(server: ProxyServer) -> None:
    text = ('{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
            '"function", "function": {"name": "f", "parameters": ' + _nested(100) + "}}]}")
    assert _post(server, CHAT, text).status_code == 200


@pytest.mark.parametrize("items", [20_000, 100_000])
def test_an_embeddings_request_beyond_2048_inputs_is_a_413_at_once(fake_llm_thread: FakeLLM, server: ProxyServer,
                                                                   items: int) -> None:
    body = orjson.dumps({"model": "fake-model", "input": [f"item {n}" for n in range(items)]}).decode()
    started = time.monotonic()
    _openai_error(_post(server, "/v1/embeddings", body), 413, "too_many_inputs")
    assert time.monotonic() - started < 10
    assert fake_llm_thread.log.count("/v1/embeddings") == 0


def test_2048_inputs_are_embedded(server: ProxyServer) -> None:
    body = orjson.dumps({"model": "fake-model", "input": [f"item {n}" for n in range(2048)]}).decode()
    response = _post(server, "/v1/embeddings", body)
    assert response.status_code == 200
    assert len(response.json()["data"]) == 2048


def test_a_search_with_an_800_deep_filter_is_a_400(qdrant_shim: QdrantShim, server: ProxyServer) -> None:
    leaf = '{"key": "text", "match": {"value": "x"}}'
    deep = '{"must": ' * 800 + leaf + "}" * 800
    seen = qdrant_shim.log.count()
    error = _qdrant_error(_post(server, SEARCH, '{"vector": [1, 0, 0, 0], "limit": 3, "filter": ' + deep + "}"), 400)
    assert "nests deeper" in error
    assert qdrant_shim.log.count() == seen


def test_a_query_with_deep_prefetch_is_a_400(qdrant_shim: QdrantShim, server: ProxyServer) -> None:
    query: dict[str, Any] = {"query": [1, 0, 0, 0], "limit": 3}
    for _ in range(100):
        query = {"prefetch": query, "query": [1, 0, 0, 0], "limit": 3}
    seen = qdrant_shim.log.count()
    error = _qdrant_error(_post(server, "/collections/docs/points/query", orjson.dumps(query).decode()), 400)
    assert "prefetch" in error
    assert qdrant_shim.log.count() == seen
    for _ in range(60):  # within Qdrant's 64 levels, and the JSON depth limit
        query = query["prefetch"]
    assert _post(server, "/collections/docs/points/query", orjson.dumps(query).decode()).status_code == 200


def test_a_batch_of_10000_searches_is_a_413(qdrant_shim: QdrantShim, server: ProxyServer) -> None:
    searches = [{"vector": [1, n, 0, 0], "limit": 3} for n in range(10_000)]
    seen = qdrant_shim.log.count()
    error = _qdrant_error(_post(server, SEARCH + "/batch", orjson.dumps({"searches": searches}).decode()), 413)
    assert "10000 searches" in error
    assert qdrant_shim.log.count() == seen
    assert _post(server, SEARCH + "/batch", orjson.dumps({"searches": searches[:100]}).decode()).status_code == 200


@pytest.mark.parametrize("searches", ['"abc"', "[1, 2, 3]", "null", '[{"vector": [1, 0, 0, 0]}, 7]'])
def test_a_batch_whose_searches_are_not_objects_is_a_qdrant_shaped_400(qdrant_shim: QdrantShim, server: ProxyServer,
                                                                       searches: str) -> None:
    seen = qdrant_shim.log.count()
    error = _qdrant_error(_post(server, SEARCH + "/batch", '{"searches": ' + searches + "}"), 400)
    assert "searches" in error
    assert qdrant_shim.log.count() == seen


def test_the_prefix_header_sent_upstream_stays_bounded(fake_llm_thread: FakeLLM, server: ProxyServer) -> None:
    documents = [{"id": f"document-number-{n}", "text": f"passage {n} " * 3} for n in range(5000)]
    body = {"model": "fake-model", "messages": [{"role": "system", "content": "Answer from the documents."},
                                                {"role": "user", "content": "what do they say?"}],
            "ragproxy": {"documents": documents}}
    rid = "prefix-header-bounded"
    assert httpx.post(server.url + CHAT, json=body, headers={"X-Request-ID": rid}, timeout=60).status_code == 200
    [forwarded] = fake_llm_thread.log.with_request_id(rid)  # not the proxy's own health probes
    sent = forwarded.headers
    assert "X-Prefix-Docs" in sent
    assert len(sent["X-Prefix-Docs"]) <= 1024
    assert sent["X-Prefix-Docs"].startswith("document-number-0,document-number-1,")
    assert sum(len(name) + len(value) + 4 for name, value in sent.items()) < 8192


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", '{"model": "fake-model", "input": [1]}'),
    ("/v1/responses", '{"model": "fake-model", "input": "hi", "tools": "junk"}'),
    (CHAT, '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": "junk"}'),
    *[(path, '{"model": "fake-reranker", "query": "q", "documents": [' + document + ']}')
      for path in ("/v1/rerank", "/v2/rerank") for document in ('{"text": 5}', "{}", '{"content": "x"}')],
    ("/v1/score", '{"model": "fake-reranker", "text_1": "q", "text_2": [{"text": 5}]}'),
    ("/v1/responses", '{"model": "fake-model", "input": "hi", "text": 5}'),
    ("/v1/responses", '{"model": "fake-model", "input": "hi", "reasoning": "high"}'),
    ("/v1/responses", '{"model": "fake-model", "input": "hi", "previous_response_id": ["a"]}'),
    ("/v1/responses", '{"model": "fake-model", "input": [{"role": "user", "content": 5}]}'),
    *[("/v1/responses/" + below, '{"model": "fake-model", "input": "hi", "previous_response_id": ["a"]}')
      for below in ("input_tokens", "compact")],
])
def test_wrong_types_the_proxy_recognises_are_a_400_never_forwarded(fake_llm_thread: FakeLLM, server: ProxyServer,
                                                                   path: str, body: str) -> None:
    """They used to go upstream (the cache bypassed them as not canonicalizable) and the upstream's 500 came back."""
    answer = _post(server, path, body)
    _openai_error(answer, 400, "invalid_type")
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert fake_llm_thread.log.count(path) == 0
