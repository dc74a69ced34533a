"""The document registry's byte bound: a flood of large search payloads cannot grow it past ``max_bytes``."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc

import orjson

from normalizer.documents import DocumentRegistry, entry_bytes
from proxy.core.context import Reply, RequestContext
from proxy.search.stages import RegisterDocuments
from proxy.server.request import Request

CAP = 1024 * 1024


def _text(rnd: random.Random, words: int) -> str:
    return " ".join(f"w{rnd.randrange(1_000_000)}" for _ in range(words))


def _search_answer(texts: list[str]) -> bytes:
    """A Qdrant search answer (REST shape) whose points carry ``texts`` as payloads."""
    points = [{"id": i, "score": 0.5, "payload": {"text": text}} for i, text in enumerate(texts)]
    return orjson.dumps({"result": points, "status": "ok", "time": 0.001})


def test_a_flood_of_large_search_payloads_stays_under_the_byte_cap() -> None:
    registry = DocumentRegistry(capacity=1_000_000, max_bytes=CAP)
    stage = RegisterDocuments(registry)
    rnd = random.Random(7)
    oldest = newest = ""
    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for search in range(20):  # 20 searches x 5 points x ~1,500 words: ~9.5 MB estimated, 9x the cap
            batch = [_text(rnd, rnd.randrange(1_000, 2_000)) for _ in range(5)]
            oldest, newest = (batch[0] if search == 0 else oldest), batch[-1]
            body = _search_answer(batch)

            async def answer(ctx: RequestContext, body: bytes = body) -> Reply:
                return Reply(status=200, body=body)

            ctx = RequestContext(request=Request("POST", "/collections/docs/points/search"),
                                 route="qdrant_search", request_id="r")
            asyncio.run(stage(ctx, answer))
            assert registry.bytes <= CAP
        del batch, body, answer, ctx
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - baseline - len(oldest) - len(newest)
    finally:
        tracemalloc.stop()
    assert registry.evicted > 0 and 0 < len(registry) < 20 * 5
    assert registry.bytes > CAP // 2, "the budget is used, not refused"
    assert held < CAP * 1.25, f"the registry holds {held} bytes of memory for a {CAP}-byte cap"
    assert registry.detect(f"Context: {newest} Question?") != [], "the newest documents are kept"
    assert registry.detect(f"Context: {oldest} Question?") == [], "the oldest leave first"


def test_a_document_larger_than_the_cap_is_not_registered_and_evicts_nothing() -> None:
    rnd = random.Random(3)
    small = [_text(rnd, 200) for _ in range(3)]
    registry = DocumentRegistry(max_bytes=sum(entry_bytes(t, 200) for t in small))
    ids = registry.add_many(small)
    huge = _text(rnd, 50_000)
    assert registry.add(huge) is None
    assert [i in registry for i in ids] == [True, True, True]
    assert registry.bytes == sum(entry_bytes(t, 200) for t in small) and registry.evicted == 0
    registry.add(_text(rnd, 200))
    assert ids[0] not in registry and ids[1] in registry and registry.evicted == 1, "one more pushes the oldest out"


def test_forgetting_returns_every_byte() -> None:
    rnd = random.Random(5)
    registry = DocumentRegistry(capacity=4, max_bytes=10**9)
    for _ in range(50):
        registry.add(_text(rnd, rnd.randrange(4, 400)))
    assert len(registry) == 4
    kept = [registry.text_words(doc_id) for doc_id in list(registry._entries)]
    assert registry.bytes == sum(entry_bytes(" ".join(words), len(words)) for words in kept if words is not None)
