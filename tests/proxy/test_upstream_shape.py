"""Answers from the cache keep the upstream's shape: fields the proxy does not know, the first delta of a stream,
the ``Content-Type`` — through a miss and a hit, seen with the official SDK and on the wire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.core.sse import iter_events
from tests.support.objects import without
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

MESSAGES: Any = [{"role": "user", "content": "What keeps its shape?"}]
VOLATILE = {"id", "created", "timings"}


def _stable(obj: Any) -> Any:
    return without(obj, VOLATILE)


def _served(flavor: str) -> Iterator[tuple[FakeLLM, ProxyServer]]:
    with FakeLLM(flavor=flavor) as fake, ProxyServer(proxy_settings(fake.url)) as proxy:
        yield fake, proxy


@pytest.fixture
def llamacpp() -> Iterator[tuple[FakeLLM, ProxyServer]]:
    yield from _served("llamacpp")


@pytest.fixture
def vllm() -> Iterator[tuple[FakeLLM, ProxyServer]]:
    yield from _served("vllm")


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": "fake-model", "messages": MESSAGES, **body},
                      timeout=30)


def _chunks(response: httpx.Response) -> list[dict[str, Any]]:
    return [orjson.loads(data) for data in iter_events(response.content) if data != b"[DONE]"]


def test_a_hit_keeps_the_upstream_s_content_type_and_unknown_fields(
        llamacpp: tuple[FakeLLM, ProxyServer]) -> None:
    fake, proxy = llamacpp
    direct = _post(fake.url, {"temperature": 0})
    miss, hit = _post(proxy.url, {"temperature": 0}), _post(proxy.url, {"temperature": 0})
    assert hit.headers["X-Cache-Status"] == "HIT"
    assert direct.headers["Content-Type"] == miss.headers["Content-Type"] == hit.headers["Content-Type"] \
        == "application/json; charset=utf-8"
    assert hit.json() == miss.json() and "timings" in hit.json()
    proxied = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    direct_sdk = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    via_proxy = proxied.chat.completions.create(model="fake-model", messages=MESSAGES, temperature=0)
    expected = direct_sdk.chat.completions.create(model="fake-model", messages=MESSAGES, temperature=0)
    assert _stable(via_proxy.model_dump()) == _stable(expected.model_dump())
    assert via_proxy.model_extra is not None and "timings" in via_proxy.model_extra


def test_a_replayed_stream_opens_like_the_upstream_s_and_keeps_its_fields(
        llamacpp: tuple[FakeLLM, ProxyServer]) -> None:
    fake, proxy = llamacpp
    body = {"stream": True, "temperature": 0.5}
    direct = _chunks(_post(fake.url, body))
    miss = _post(proxy.url, body)
    hit = _post(proxy.url, body)
    assert hit.headers["X-Cache-Status"] == "HIT"
    opening = _chunks(hit)[0]["choices"][0]["delta"]
    assert opening == direct[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert "timings" in _chunks(hit)[-1], "the finishing chunk carries llama.cpp's timings again"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in _chunks(hit)) == \
        "".join(c["choices"][0]["delta"].get("content") or "" for c in _chunks(miss))
    plain = _post(proxy.url, {"temperature": 0.5})
    assert plain.headers["X-Cache-Status"] == "HIT"
    assert plain.json()["timings"] == _chunks(miss)[-1]["timings"], "kept from the stream's last chunk"
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    streamed = list(client.chat.completions.create(model="fake-model", messages=MESSAGES, temperature=0.5,
                                                   stream=True))
    assert streamed[0].choices[0].delta.content is None and streamed[0].choices[0].delta.role == "assistant"


def test_vendor_fields_survive_a_streamed_miss_and_a_hit(vllm: tuple[FakeLLM, ProxyServer]) -> None:
    fake, proxy = vllm
    _post(proxy.url, {"stream": True})
    hit = _post(proxy.url, {})
    assert hit.headers["X-Cache-Status"] == "HIT"
    assert "stop_reason" in hit.json()["choices"][0], "vLLM's choice field, read from the stream"
    replayed = _chunks(_post(proxy.url, {"stream": True}))
    assert "stop_reason" in replayed[-1]["choices"][0]
    direct = _post(fake.url, {})
    plain_miss = _post(proxy.url, {"max_tokens": 99})
    assert _post(proxy.url, {"max_tokens": 99}).json() == plain_miss.json()
    assert set(plain_miss.json()) == set(direct.json()), "prompt_logprobs, kv_transfer_params kept"


def test_embeddings_keep_the_upstream_s_envelope(vllm: tuple[FakeLLM, ProxyServer]) -> None:
    fake, proxy = vllm
    direct = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    proxied = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    expected = direct.embeddings.create(model="fake-model", input=["alpha", "beta"]).model_dump()
    miss = proxied.embeddings.create(model="fake-model", input=["alpha", "beta"]).model_dump()
    raw = proxied.embeddings.with_raw_response.create(model="fake-model", input=["alpha", "beta"])
    assert raw.headers["X-Cache-Status"] == "HIT"
    hit = raw.parse().model_dump()
    assert _stable(miss) == _stable(hit) == _stable(expected)
    assert hit["usage"] == expected["usage"], "vLLM's completion_tokens and prompt_tokens_details kept"
    assert hit["id"] == miss["id"] and "created" in hit
    partial = proxied.embeddings.create(model="fake-model", input=["alpha", "gamma"]).model_dump()
    full = direct.embeddings.create(model="fake-model", input=["alpha", "gamma"]).model_dump()
    assert _stable(partial) == _stable(full)
