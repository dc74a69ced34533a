"""The drop-in promise, tested literally: the official SDKs get the same results through the proxy as directly."""

from __future__ import annotations

from typing import Any

import openai
from qdrant_client import QdrantClient, models

from tests.support.objects import without
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

VOLATILE = {"id", "created", "system_fingerprint"}
MESSAGES: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a proxy?"}]


def _stable(obj: Any) -> Any:
    return without(obj, VOLATILE)


def _clients(fake: FakeLLM, proxy: ProxyServer) -> tuple[openai.OpenAI, openai.OpenAI]:
    return (openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0),
            openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0))


def _streamed(client: openai.OpenAI, **kwargs: Any) -> dict[str, Any]:
    text, finish, usage, roles = [], None, None, []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return {"text": "".join(text), "finish": finish, "usage": usage, "roles": roles}


def test_chat_completion_sync(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    direct, proxied = _clients(fake_llm_thread, proxy)
    a = direct.chat.completions.create(model="fake-model", messages=MESSAGES, temperature=0)
    b = proxied.chat.completions.create(model="fake-model", messages=MESSAGES, temperature=0)
    assert _stable(b.model_dump()) == _stable(a.model_dump())
    assert b.choices[0].message.content


def test_chat_stream_sync_with_usage(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    direct, proxied = _clients(fake_llm_thread, proxy)
    kwargs: Any = {"model": "fake-model", "messages": MESSAGES, "stream_options": {"include_usage": True}}
    a, b = _streamed(direct, **kwargs), _streamed(proxied, **kwargs)
    assert b == a
    assert b["usage"] is not None and b["text"]


async def test_chat_async_stream_and_plain(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    direct = openai.AsyncOpenAI(base_url=fake_llm_thread.base_url, api_key="k", max_retries=0)
    proxied = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    a = await direct.chat.completions.create(model="fake-model", messages=MESSAGES)
    b = await proxied.chat.completions.create(model="fake-model", messages=MESSAGES)
    assert _stable(b.model_dump()) == _stable(a.model_dump())
    pieces = []
    async for chunk in await proxied.chat.completions.create(model="fake-model", messages=MESSAGES, stream=True):
        pieces.extend(choice.delta.content or "" for choice in chunk.choices)
    assert "".join(pieces) == a.choices[0].message.content
    await direct.close()
    await proxied.close()


def test_completions_embeddings_models(fake_llm_thread: FakeLLM, proxy: ProxyServer) -> None:
    direct, proxied = _clients(fake_llm_thread, proxy)
    a = direct.completions.create(model="fake-model", prompt="Say hi", max_tokens=8)
    b = proxied.completions.create(model="fake-model", prompt="Say hi", max_tokens=8)
    assert _stable(b.model_dump()) == _stable(a.model_dump())
    e1 = direct.embeddings.create(model="fake-model", input=["alpha", "beta"])
    e2 = proxied.embeddings.create(model="fake-model", input=["alpha", "beta"])
    assert e2.model_dump() == e1.model_dump()
    assert proxied.models.list().model_dump() == direct.models.list().model_dump()


def test_qdrant_client_rest(qdrant_shim: QdrantShim, proxy: ProxyServer) -> None:
    results = []
    for url, name in ((qdrant_shim.url, "direct"), (proxy.url, "proxied")):
        client = QdrantClient(url=url, prefer_grpc=False, check_compatibility=False)
        client.create_collection(name, vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
        client.upsert(name, points=[
            models.PointStruct(id=i, vector=[1.0, i, 0.5, -i], payload={"text": f"doc {i}", "n": i})
            for i in range(1, 21)
        ])
        found = client.query_points(name, query=[1.0, 3.0, 0.5, -3.0], limit=5, with_payload=True).points
        searched = [r.points for r in client.query_batch_points(name, requests=[
            models.QueryRequest(query=[1.0, 2.0, 0.0, 1.0], limit=3),
            models.QueryRequest(query=[0.0, 1.0, 1.0, 1.0], limit=2,
                                filter=models.Filter(must=[models.FieldCondition(
                                    key="n", range=models.Range(gte=10))])),
        ])]
        scrolled, _ = client.scroll(name, limit=4, with_payload=True)
        client.set_payload(name, payload={"tag": "x"}, points=[1, 2])
        client.delete(name, points_selector=models.PointIdsList(points=[3]))
        retrieved = client.retrieve(name, ids=[1, 2, 3])
        results.append((
            [(p.id, round(p.score, 5), p.payload) for p in found],
            [[(p.id, round(p.score, 5)) for p in batch] for batch in searched],
            [p.id for p in scrolled],
            client.count(name).count,
            sorted((p.id, tuple(sorted((p.payload or {}).items()))) for p in retrieved),
        ))
        assert client.collection_exists(name)
        client.delete_collection(name)
        client.close()
    assert results[0] == results[1]
