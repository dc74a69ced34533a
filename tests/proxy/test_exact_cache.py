"""The L1 exact tier through HTTP: status headers, stream/non-stream interchange, cache control, bypass rules,
coalescing and per-item embeddings."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from loadtest.fold_pairs import MEANING_CHANGES
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"


def _body(question: str = "What is RAG?", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": question}], **extra}


def _post(proxy: ProxyServer, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(proxy.url + CHAT, json=body, headers=headers, timeout=30)


def test_miss_then_hit_with_headers(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    first = _post(caching_proxy, _body())
    second = _post(caching_proxy, _body())
    assert first.headers["X-Cache-Status"] == "MISS"
    assert second.headers["X-Cache-Status"] == "HIT"
    assert second.headers["X-Cache-Tier"] == "l1"
    assert int(second.headers["Age"]) >= 0
    assert "X-Cache-Key" not in second.headers, "the key is an oracle; hidden unless configured"
    assert second.json() == first.json(), "a hit returns the original body, usage included"
    assert fake_llm_thread.log.count(CHAT) == 1


def test_equivalent_encodings_share_an_entry(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    _post(caching_proxy, _body(temperature=1))
    again = _post(caching_proxy, {"messages": [{"content": [{"type": "text", "text": "What is RAG?"}],
                                                "role": "user"}], "model": "fake-model", "temperature": 1.0})
    assert again.headers["X-Cache-Status"] == "HIT"
    different = _post(caching_proxy, _body(temperature=0))
    assert different.headers["X-Cache-Status"] == "MISS"


def test_variants_that_keep_the_meaning_are_exact_hits_from_the_first_repeat(
        fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    """Whitespace, canonically equivalent Unicode and a final question mark of the final question do not change
    the answer: one entry serves them all, with no embedding (L2 is off here)."""
    first = _post(caching_proxy, _body("What is the caf\u00e9 of Retrieval-Augmented Generation?"))
    for variant in ("What is the caf\u00e9 of Retrieval-Augmented Generation",
                    "  What is the  caf\u00e9 of Retrieval-Augmented\u00a0Generation?",
                    "What is the cafe\u0301 of Retrieval-Augmented Generation  "):
        again = _post(caching_proxy, _body(variant))
        assert again.headers["X-Cache-Status"] == "HIT", variant
        assert again.json() == first.json()
    assert fake_llm_thread.log.count(CHAT) == 1
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}]
    _post(caching_proxy, {"model": "fake-model", "messages": [*history, {"role": "user", "content": "Why?"}]})
    earlier = [{"role": "user", "content": "Hello  "}, history[1], {"role": "user", "content": "Why"}]
    assert _post(caching_proxy, {"model": "fake-model", "messages": earlier}).headers["X-Cache-Status"] == "MISS", \
        "only the final question is folded"
    client = openai.OpenAI(base_url=caching_proxy.url + "/v1", api_key="k", max_retries=0)
    statuses = [client.responses.with_raw_response.create(model="fake-model", input=question, store=False)
                .headers["X-Cache-Status"] for question in ("What is a vector index?", "What is a  vector index")]
    assert statuses == ["MISS", "HIT"], "the Responses API's final input item too"


def test_variants_that_can_change_the_answer_never_share_an_entry(
        fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    for one, other in MEANING_CHANGES:
        _post(caching_proxy, _body(one))
        assert _post(caching_proxy, _body(other)).headers["X-Cache-Status"] == "MISS", (one, other)


def test_streamed_miss_serves_plain_hit_and_back(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    client = openai.OpenAI(base_url=caching_proxy.url + "/v1", api_key="k", max_retries=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        stream=True, **_body("stream me"))
        if c.choices)
    raw = client.chat.completions.with_raw_response.create(**_body("stream me"))
    assert raw.headers["X-Cache-Status"] == "HIT"
    assert raw.parse().choices[0].message.content == streamed
    # and a plain miss replayed as a stream, with the usage chunk the client asks for
    plain = client.chat.completions.create(**_body("plain first"))
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **_body("plain first")))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == plain.usage.total_tokens  # type: ignore[union-attr]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason
    assert fake_llm_thread.log.count(CHAT) == 2


@pytest.mark.parametrize(("headers", "second_status", "upstream_calls", "stored"), [
    ({"Cache-Control": "no-cache"}, "REFRESH", 2, True),
    ({"x-portkey-cache-force-refresh": "true"}, "REFRESH", 2, True),
    ({"Cache-Control": "no-store"}, "HIT", 1, False),
    ({"cf-aig-skip-cache": "true"}, "BYPASS", 2, False),
    ({"Cache-Control": "max-age=0"}, "REFRESH", 2, True),
    ({"Cache-Control": "max-age=3600"}, "HIT", 1, True),
])
def test_cache_control_on_second_request(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer,
                                         headers: dict[str, str], second_status: str, upstream_calls: int,
                                         stored: bool) -> None:
    _post(caching_proxy, _body())
    time.sleep(0.01)
    second = _post(caching_proxy, _body(), **headers)
    assert second.headers["X-Cache-Status"] == second_status
    assert fake_llm_thread.log.count(CHAT) == upstream_calls


def test_no_store_on_first_request_keeps_nothing(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    _post(caching_proxy, _body(), **{"Cache-Control": "no-store"})
    assert _post(caching_proxy, _body()).headers["X-Cache-Status"] == "MISS"


def test_ttl_from_header_and_litellm_body(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    _post(caching_proxy, _body("short"), **{"x-ragproxy-ttl": "2"})
    _post(caching_proxy, _body("short body", cache={"ttl": 2}))
    assert _post(caching_proxy, _body("short")).headers["X-Cache-Status"] == "HIT"
    time.sleep(2.2)
    assert _post(caching_proxy, _body("short")).headers["X-Cache-Status"] == "MISS"
    assert _post(caching_proxy, _body("short body")).headers["X-Cache-Status"] == "MISS"
    sent = [entry.json() for entry in fake_llm_thread.log.for_path(CHAT)]
    assert all("cache" not in body for body in sent), "the proxy's own body fields are never forwarded"


def test_namespaces_are_separate(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    _post(caching_proxy, _body(), **{"x-ragproxy-namespace": "docs-v1"})
    assert _post(caching_proxy, _body(), **{"x-ragproxy-namespace": "docs-v2"}).headers["X-Cache-Status"] == "MISS"
    assert _post(caching_proxy, _body(), **{"x-ragproxy-namespace": "docs-v1"}).headers["X-Cache-Status"] == "HIT"


@pytest.mark.parametrize("headers", [{"Cache-Control": "max-age=abc"}, {"x-ragproxy-ttl": "-1"},
                                     {"x-ragproxy-namespace": "../etc"}])
def test_invalid_cache_control_is_400(caching_proxy: ProxyServer, headers: dict[str, str]) -> None:
    response = _post(caching_proxy, _body(), **headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_cache_control"


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}, {"some_vendor_field": 1}])
def test_uncacheable_requests_bypass(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer,
                                     extra: dict[str, Any]) -> None:
    for _ in range(2):
        assert _post(caching_proxy, _body(**extra)).headers["X-Cache-Status"] == "BYPASS"
    assert fake_llm_thread.log.count(CHAT) == 2


def test_errors_and_aborted_streams_are_not_stored(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    fake_llm_thread.faults.fail_next(500)
    assert _post(caching_proxy, _body()).status_code == 500
    assert _post(caching_proxy, _body()).headers["X-Cache-Status"] == "MISS"
    fake_llm_thread.faults.reset_after(chunks=1)
    cut = httpx.post(caching_proxy.url + CHAT, json=_body("cut", stream=True))
    assert b'"error"' in cut.content and b"[DONE]" not in cut.content, "a broken stream never looks complete"
    assert _post(caching_proxy, _body("cut")).headers["X-Cache-Status"] == "MISS"


@pytest.mark.parametrize("stream", [False, True])
async def test_hundred_identical_misses_make_one_upstream_call(fake_llm_thread: FakeLLM,
                                                               caching_proxy: ProxyServer, stream: bool) -> None:
    fake_llm_thread.latency_s = 0.5
    client = openai.AsyncOpenAI(base_url=caching_proxy.url + "/v1", api_key="k", max_retries=0, timeout=30)

    async def ask() -> str:
        if not stream:
            return (await client.chat.completions.create(**_body("popular"))).choices[0].message.content or ""
        pieces = []
        async for chunk in await client.chat.completions.create(stream=True, **_body("popular")):
            pieces.extend(c.delta.content or "" for c in chunk.choices)
        return "".join(pieces)

    answers = await asyncio.gather(*(ask() for _ in range(100)))
    assert len(set(answers)) == 1 and answers[0]
    assert fake_llm_thread.log.count(CHAT) == 1
    await client.close()


def test_embedding_batch_forwards_only_missing_items(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    direct = openai.OpenAI(base_url=fake_llm_thread.base_url, api_key="k")
    client = openai.OpenAI(base_url=caching_proxy.url + "/v1", api_key="k", max_retries=0)
    client.embeddings.create(model="fake-model", input=["alpha", "beta"])
    raw = client.embeddings.with_raw_response.create(model="fake-model", input=["gamma", "alpha", "beta", "delta"])
    assert raw.headers["X-Cache-Hits"] == "2/4"
    expected = direct.embeddings.create(model="fake-model", input=["gamma", "alpha", "beta", "delta"])
    got = raw.parse()
    assert [d.index for d in got.data] == [0, 1, 2, 3]
    for mine, theirs in zip(got.data, expected.data, strict=True):
        assert mine.embedding == pytest.approx(theirs.embedding)
    forwarded = [entry.json()["input"] for entry in fake_llm_thread.log.for_path("/v1/embeddings")]
    assert forwarded[:2] == [["alpha", "beta"], ["gamma", "delta"]]
    floats = client.embeddings.create(model="fake-model", input="alpha", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(expected.data[1].embedding)


def test_an_embeddings_request_that_bypasses_says_so_and_why(fake_llm_thread: FakeLLM,
                                                             caching_proxy: ProxyServer) -> None:
    answer = httpx.post(caching_proxy.url + "/v1/embeddings", json={"model": "fake-model", "input": "x", "novel": 1})
    assert answer.status_code == 200
    assert answer.headers["X-Cache-Status"] == "BYPASS"
    assert answer.headers["X-Cache-Bypass-Reason"] == "unknown field(s): novel"
