"""The Responses API through the proxy, with the official SDK as client: the same objects as directly, repeats
answered from the cache in either form (a streamed miss replayed as one object and back), tools, bypasses."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from qdrant_client import QdrantClient, models

from normalizer.documents import content_id
from proxy.core.outcome import MICRO
from proxy.credits.pricing import format_credits, to_micro
from proxy.credits.store import ledger_entries
from tests.support.objects import without
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

VOLATILE = {"id", "created_at", "call_id"}
MODEL = "fake-model"
TOOL: Any = {"type": "function", "name": "lookup", "description": "Look a word up",
             "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                            "additionalProperties": False},
             "strict": True}


def _stable(obj: Any) -> Any:
    return without(obj, VOLATILE)


@pytest.fixture
def clients(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    with ProxyServer(proxy_settings(fake_llm_thread.url, qdrant_shim.url)) as proxy:
        yield (openai.OpenAI(base_url=fake_llm_thread.base_url, api_key="k", max_retries=0),
               openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0))


def _plain(obj: Any) -> Any:
    """A parsed response (the stream helper's) without what parsing adds (``parsed``, ``parsed_arguments``)."""
    return without(obj, ("parsed", "parsed_arguments"))


def _create(client: openai.OpenAI, **kwargs: Any) -> tuple[str | None, dict[str, Any]]:
    raw = client.responses.with_raw_response.create(model=MODEL, **kwargs)
    return raw.headers.get("X-Cache-Status"), raw.parse().model_dump()


def _streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str | None, list[Any]]:
    """The raw events of ``create(stream=True)``, and the cache status."""
    raw = client.responses.with_raw_response.create(model=MODEL, stream=True, **kwargs)
    return raw.headers.get("X-Cache-Status"), list(raw.parse())


def _final(client: openai.OpenAI, **kwargs: Any) -> tuple[list[str], dict[str, Any]]:
    """The SDK's own stream helper: its event types and the response it assembles."""
    with client.responses.stream(model=MODEL, **kwargs) as stream:
        types = [event.type for event in stream]
        return types, _plain(stream.get_final_response().model_dump())


def test_plain_create_gives_the_direct_object_and_a_repeat_is_a_hit(
        clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    direct, proxied = clients
    kwargs: Any = {"input": "What is a proxy?", "instructions": "Be brief.", "store": False}
    expected = direct.responses.create(model=MODEL, **kwargs).model_dump()
    status, first = _create(proxied, **kwargs)
    assert status == "MISS"
    assert _stable(first) == _stable(expected)
    status, again = _create(proxied, **kwargs)
    assert status == "HIT"
    assert again == first, "the stored object, ids included"


def test_streamed_miss_then_streamed_hit_both_parse_with_the_sdk(
        clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    direct, proxied = clients
    kwargs: Any = {"input": "Explain caching in one line.", "store": False}
    _, expected = _final(direct, **kwargs)
    types_miss, miss = _final(proxied, **kwargs)
    assert _stable(miss) == _stable(expected)
    status, events = _streamed(proxied, **kwargs)
    assert status == "HIT"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and events[-1].response.model_dump() == miss
    types_hit, hit = _final(proxied, **kwargs)
    assert hit == miss
    assert types_hit[:4] == types_miss[:4] == ["response.created", "response.in_progress",
                                               "response.output_item.added", "response.content_part.added"]
    assert types_hit[-4:] == types_miss[-4:] == ["response.output_text.done", "response.content_part.done",
                                                 "response.output_item.done", "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == miss["output"][0]["content"][0]["text"]


def test_a_streamed_miss_answers_a_plain_repeat_and_back(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    _, streamed = _final(proxied, input="First streamed, then plain.", store=False)
    status, plain = _create(proxied, input="First streamed, then plain.", store=False)
    assert (status, plain) == ("HIT", streamed)
    status, first = _create(proxied, input="First plain, then streamed.", store=False)
    assert status == "MISS"
    status, events = _streamed(proxied, input="First plain, then streamed.", store=False)
    assert status == "HIT" and events[-1].response.model_dump() == first
    assert _final(proxied, input="First plain, then streamed.", store=False)[1] == first


def test_function_calls_plain_and_streamed(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    direct, proxied = clients
    kwargs: Any = {"input": "Please lookup the word cache", "tools": [TOOL], "store": False}
    expected = direct.responses.create(model=MODEL, **kwargs).model_dump()
    status, first = _create(proxied, **kwargs)
    assert status == "MISS" and _stable(first) == _stable(expected)
    assert first["output"][0]["type"] == "function_call" and first["output"][0]["name"] == "lookup"
    _, streamed_hit = _final(proxied, **kwargs)
    assert streamed_hit == first, "the SDK assembles the replayed call (its arguments streamed in pieces)"
    status, events = _streamed(proxied, **kwargs)
    assert status == "HIT"
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert pieces == first["output"][0]["arguments"]
    follow_up: Any = [{"role": "user", "content": "Please lookup the word cache"}, first["output"][0],
                      {"type": "function_call_output", "call_id": first["output"][0]["call_id"], "output": "a store"}]
    direct_answer = direct.responses.create(model=MODEL, input=follow_up, tools=[TOOL], store=False).model_dump()
    status, answer = _create(proxied, input=follow_up, tools=[TOOL], store=False)
    assert status == "MISS" and _stable(answer) == _stable(direct_answer)
    assert answer["output"][0]["type"] == "message"
    assert _create(proxied, input=follow_up, tools=[TOOL], store=False) == ("HIT", answer)


def test_streamed_function_call_miss_is_stored_and_replayed(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    direct, proxied = clients
    kwargs: Any = {"input": "lookup caching please", "tools": [TOOL], "store": False}
    _, expected = _final(direct, **kwargs)
    _, miss = _final(proxied, **kwargs)
    assert _stable(miss) == _stable(expected)
    assert _create(proxied, **kwargs) == ("HIT", miss)


def test_reasoning_summaries_and_cut_answers_replay(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    _, first = _create(proxied, input="Why cache?", reasoning={"summary": "auto"}, store=False)
    status, events = _streamed(proxied, input="Why cache?", reasoning={"summary": "auto"}, store=False)
    assert status == "HIT" and events[-1].response.model_dump() == first
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert summary == first["output"][0]["summary"][0]["text"]
    _, cut = _create(proxied, input="one two three four five", max_output_tokens=2, store=False)
    assert cut["status"] == "incomplete"
    status, events = _streamed(proxied, input="one two three four five", max_output_tokens=2, store=False)
    assert status == "HIT" and events[-1].type == "response.incomplete"
    assert events[-1].response.model_dump() == cut


def test_state_the_key_cannot_see_bypasses_with_its_reason(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    raw = proxied.responses.with_raw_response.create(model=MODEL, input="Remember me", extra_body={"background": True})
    assert raw.headers["X-Cache-Status"] == "BYPASS" and "background" in raw.headers["X-Cache-Bypass-Reason"]
    for extra in ({"conversation": "conv_1"}, {"prompt": {"id": "pmpt_1"}}):  # their owner cannot be checked
        with pytest.raises(openai.BadRequestError) as refused:
            proxied.responses.create(model=MODEL, input="Remember me", extra_body=extra)
        assert refused.value.param == next(iter(extra))
    unknown = proxied.responses.with_raw_response.create(model=MODEL, input="x", store=False,
                                                         extra_body={"top_k": 3})
    assert unknown.headers["X-Cache-Bypass-Reason"] == "unknown field(s): top_k"


def test_stored_requests_bypass_when_configured_off(fake_llm_thread: FakeLLM) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.cache_stored_responses": False})
    with ProxyServer(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        raw = client.responses.with_raw_response.create(model=MODEL, input="Stored, not cached")
        assert raw.headers["X-Cache-Status"] == "BYPASS"
        assert "cache.cache_stored_responses is off" in raw.headers["X-Cache-Bypass-Reason"]
        assert client.responses.retrieve(raw.parse().id).id == raw.parse().id, "still recorded as its tenant's"
        assert _create(client, input="Stored, not cached", store=False)[0] == "MISS"


async def test_async_client_streams_a_hit(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    _, first = _create(proxied, input="Async please", store=False)
    client = openai.AsyncOpenAI(base_url=str(proxied.base_url), api_key="k", max_retries=0)
    async with client.responses.stream(model=MODEL, input="Async please", store=False) as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert _plain(final.model_dump()) == first and "".join(deltas) == final.output_text
    await client.close()


def test_credits_settle_from_the_response_usage_plain_and_streamed(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path), "credits.sqlite_synchronous": "NORMAL",
        "credits.models": {MODEL: {"prompt_per_1k": 1, "completion_per_1k": 2, "context_tokens": 4096}}})
    with ProxyServer(settings) as proxy:
        keys, store = proxy.runtime.credits.keys, proxy.runtime.credits.store
        assert keys is not None and store is not None
        key = proxy.call(keys.create("rosa", "acme")).plaintext
        proxy.call(store.top_up("rosa", 20 * MICRO, tenant="acme"))
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
        raw = client.responses.with_raw_response.create(model=MODEL, input="Bill me", store=False)
        usage = raw.parse().usage
        assert usage is not None
        assert raw.headers["X-Credits-Charged"] == format_credits(
            to_micro((usage.input_tokens * 1 + usage.output_tokens * 2) / Decimal(1000)))
        with client.responses.stream(model=MODEL, input="Bill my stream", store=False) as stream:
            final = stream.get_final_response()
        assert final.usage is not None, "the terminal event keeps its usage: it is not a usage-only chunk"
        sent = fake_llm_thread.log.for_path("/v1/responses")[-1].json()
        assert "stream_options" not in sent, "the Responses API has no include_usage to ask for"
        hit = client.responses.with_raw_response.create(model=MODEL, input="Bill me", store=False)
        assert hit.headers["X-Cache-Status"] == "HIT"
        assert Decimal(hit.headers["X-Credits-Charged"]) == pytest.approx(
            Decimal(raw.headers["X-Credits-Charged"]) / 10, abs=Decimal("0.000001"))

        async def charges() -> list[Any]:
            return [e async for e in ledger_entries(store) if e.user == "rosa" and e.kind == "charge"]

        entries = proxy.call(charges())
        assert [(e.prompt_tokens, e.completion_tokens, e.usage_source) for e in entries[:2]] == [
            (usage.input_tokens, usage.output_tokens, "reported"),
            (final.usage.input_tokens, final.usage.output_tokens, "reported")]
        small = proxy.call(keys.create("sam", "acme")).plaintext
        proxy.call(store.top_up("sam", MICRO // 5, tenant="acme"))
        for limit, status in ((10, 200), (None, 429)):
            body = {"model": MODEL, "input": "x", "store": False, "max_output_tokens": limit}
            answer = httpx.post(proxy.url + "/v1/responses", headers={"Authorization": f"Bearer {small}"}, json=body,
                                timeout=30)
            assert answer.status_code == status, "the worst case bounds the output by max_output_tokens"


def test_a_stream_cut_upstream_raises_in_the_sdk_and_is_never_stored(
        fake_llm_thread: FakeLLM, clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    fake_llm_thread.faults.reset_after(4)
    with pytest.raises(openai.APIError), proxied.responses.stream(model=MODEL, input="Cut me", store=False) as stream:
        for _event in stream:
            pass
    assert _create(proxied, input="Cut me", store=False)[0] == "MISS", "the half stream was not stored"


def test_documents_from_searches_are_recognised_in_the_input(fake_llm_thread: FakeLLM,
                                                             qdrant_shim: QdrantShim) -> None:
    """A Responses answer built on retrieved documents is tagged with them: invalidating one drops the answer."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{"cache.l3.enabled": False})
    texts = ["The Eiffel Tower is 330 metres tall and was finished in 1889.",
             "The Louvre is the most visited museum in the world, in Paris."]
    with ProxyServer(settings, admin=True) as proxy:
        qdrant = QdrantClient(url=proxy.url, prefer_grpc=False, check_compatibility=False)
        qdrant.create_collection("docs", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE))
        qdrant.upsert("docs", points=[models.PointStruct(id=i, vector=[1.0, float(i)], payload={"text": text})
                                      for i, text in enumerate(texts)])
        found = qdrant.query_points("docs", query=[1.0, 0.5], limit=2, with_payload=True).points
        context = "\n\n".join(str((point.payload or {})["text"]) for point in found)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        kwargs: Any = {"instructions": f"Answer from these documents:\n\n{context}", "input": "How tall is it?",
                       "store": False}
        assert _create(client, **kwargs)[0] == "MISS"
        assert _create(client, **kwargs)[0] == "HIT"
        removed = httpx.post(proxy.admin_url + "/admin/invalidate", json={"documents": [content_id(texts[1])]})
        assert removed.json()["removed"]["l1"] == 1
        assert _create(client, **kwargs)[0] == "MISS"
        qdrant.close()


def test_bad_input_is_a_clear_openai_shaped_4xx(clients: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    _, proxied = clients
    with pytest.raises(openai.BadRequestError, match=r"ragproxy\.documents is not supported on /v1/responses"):
        proxied.responses.create(model=MODEL, input="x", store=False,
                                 extra_body={"ragproxy": {"documents": [{"text": "a document"}]}})
    url = str(proxied.base_url) + "responses"
    broken = httpx.post(url, content=b'{"model": ', headers={"Content-Type": "application/json"}, timeout=30)
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    missing = httpx.post(url, json={"model": MODEL, "store": False}, timeout=30)
    assert missing.status_code == 400 and missing.headers["X-Cache-Status"] == "BYPASS"
    assert missing.json()["error"]["param"] == "input", "the upstream's own error, passed through"
