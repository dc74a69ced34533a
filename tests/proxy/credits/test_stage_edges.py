"""Credits stages run directly in a Pipeline: vector searches, replies without usage, reused request ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict

from proxy.core.context import Reply, RequestContext
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Pipeline
from proxy.core.usage import Usage
from proxy.credits.pricing import ModelPrice, PriceBook
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.stages import Credits, SearchCredits
from proxy.credits.store import ChargeDetails, CreditStore, LedgerFilter, ledger_entries
from proxy.server.request import Request

CREDIT = 1_000_000
PRICES = PriceBook(
    models={"m": ModelPrice(Decimal("1"), Decimal("1"))},
    search_price=Decimal("0.01"),
    hit_multipliers={"retrieval": Decimal("0.1")},
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CreditStore]:
    store = SqliteCreditStore(tmp_path / "credits.sqlite3")
    await store.top_up("ann", 10 * CREDIT)
    yield store
    await store.close()


def context(body: dict[str, Any], request_id: str = "req-1") -> RequestContext:
    raw = orjson.dumps(body)
    request = Request("POST", "/collections/docs/points/search")
    return RequestContext(
        request=request,
        route="search",
        request_id=request_id,
        raw_body=raw,
        body=body,
        user="ann",
        tenant="acme",
    )


def answering(body: dict[str, Any], tier: str | None = None):  # type: ignore[no-untyped-def]
    async def terminal(ctx: RequestContext) -> Reply:
        if tier is not None:
            ctx.outcome = Outcome(CacheStatus.HIT, tier, Matched.EXACT)
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=orjson.dumps(body))

    return terminal


async def costs(store: CreditStore) -> list[int]:
    return [e.cost async for e in ledger_entries(store, LedgerFilter(kind="charge"))]


async def test_vector_searches_cost_per_search_and_less_on_a_retrieval_hit(store: CreditStore) -> None:
    stage = SearchCredits(store, PRICES)
    batch = {"searches": [{"vector": [0.1]}, {"vector": [0.2]}, {"vector": [0.3]}]}
    ctx = context(batch, "s1")
    await Pipeline([stage], answering({"result": []}))(ctx)
    assert ctx.response_headers["X-Credits-Charged"] == "0.03"
    await Pipeline([stage], answering({"result": []}, tier="retrieval"))(context({"vector": [0.1]}, "s2"))
    assert await costs(store) == [30_000, 1_000]


async def test_a_search_answered_from_a_nearby_vector_costs_the_search_cache_s_share(store: CreditStore) -> None:
    """Pricing reads how a hit matched, not its status alone: a search answered from a nearby query vector (a
    ``SEMANTIC_HIT``) is the search cache's hit, priced at ``retrieval``'s share, not at the semantic tier's."""
    prices = PriceBook(search_price=Decimal("0.01"),
                       hit_multipliers={"retrieval": Decimal("0.1"), "l2": Decimal("0.5")})

    async def nearby(ctx: RequestContext) -> Reply:
        ctx.outcome = Outcome(CacheStatus.SEMANTIC_HIT, "retrieval", Matched.NEARBY)
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=b'{"result": []}')

    await Pipeline([SearchCredits(store, prices)], nearby)(context({"vector": [0.1]}, "near"))
    assert await costs(store) == [1_000]


async def test_an_estimate_counts_the_prompt_sent_upstream_not_the_clients(store: CreditStore) -> None:
    """The embeddings items cache sends only the missing inputs (a named patch): what the upstream did, when it
    does not say, is estimated from those; the client's body is left as it was."""
    body = {"model": "m", "input": ["a" * 400, "b" * 40]}
    ctx = context(body)

    async def missing_only(ctx: RequestContext) -> Reply:
        ctx.patch("embedding_items.missing", lambda sent: {**sent, "input": sent["input"][1:]})
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=b"{}")

    await Pipeline([Credits(store, PRICES)], missing_only)(ctx)
    [entry] = [e async for e in ledger_entries(store, LedgerFilter(kind="charge"))]
    assert entry.prompt_tokens == 10, "the client sent 110 tokens, the upstream was sent 10"
    assert ctx.body == {"model": "m", "input": ["a" * 400, "b" * 40]}


async def test_a_reply_without_usage_is_charged_an_estimate_not_its_reservation(store: CreditStore) -> None:
    """An upstream 200 the proxy could not read used to be charged the whole reservation (here 29 times the
    estimate; with the default limits about 1,000 times a normal answer)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "what is in the documents?"}], "max_tokens": 100}
    ctx = context(body)
    unreadable = Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=b"<html>not json</html>")

    async def terminal(ctx: RequestContext) -> Reply:
        return unreadable

    await Pipeline([Credits(store, PRICES)], terminal)(ctx)
    [entry] = [e async for e in ledger_entries(store, LedgerFilter(kind="charge"))]
    assert (entry.usage_source, entry.prompt_tokens, entry.completion_tokens) == ("estimated", 8, 6)
    assert entry.cost == PRICES.actual_cost("m", Usage(8, 6)) < PRICES.worst_case(body, len(ctx.raw_body)) / 10


async def test_usage_beyond_what_the_request_allows_is_not_believed(store: CreditStore) -> None:
    """Usage past max_tokens used to be charged as reported, up to the whole balance."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "n": 2}
    ctx = context(body)
    await Pipeline([Credits(store, PRICES)], answering({"usage": {"prompt_tokens": 40,
                                                                  "completion_tokens": 10**9}}))(ctx)
    [entry] = [e async for e in ledger_entries(store, LedgerFilter(kind="charge"))]
    assert (entry.usage_source, entry.prompt_tokens, entry.completion_tokens) == ("capped", 40, 200)
    assert ctx.response_headers["X-Credits-Charged"] == "0.24", "40 + 2 x 100 tokens at 1 credit per 1,000"
    assert PRICES.bounded(body, Usage(10**9, 5, 10**9)) == Usage(32_768, 5, 32_768), "no more than the context"


async def test_the_client_s_request_id_never_becomes_the_ledger_key(store: CreditStore) -> None:
    await store.reserve("dup", "ann", 1, 60)
    await store.settle("dup", "ann", 1, ChargeDetails())
    body = {"model": "m", "messages": [], "max_tokens": 1}
    usage = {"usage": {"prompt_tokens": 1000, "completion_tokens": 0}}
    contexts = [context(body, "dup") for _ in range(2)]
    for ctx in contexts:
        await Pipeline([Credits(store, PRICES)], answering(usage))(ctx)
    entries = [e async for e in ledger_entries(store, LedgerFilter(kind="charge"))]
    assert [e.cost for e in entries] == [1, CREDIT, CREDIT]
    assert [e.request_id for e in entries[1:]] == [ctx.response_headers["X-Credits-Request-ID"] for ctx in contexts]
    assert "dup" not in {e.request_id for e in entries[1:]}


@pytest.mark.parametrize("reached_upstream", [False, True])
async def test_a_request_cancelled_before_its_answer_is_charged_only_once_it_reached_the_upstream(
        store: CreditStore, reached_upstream: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "twelve chars"}], "max_tokens": 100}
    ctx = context(body)
    waiting = asyncio.Event()

    async def terminal(ctx: RequestContext) -> Reply:
        ctx.upstream_called = reached_upstream
        waiting.set()
        await asyncio.Event().wait()  # the upstream is slow; the client hangs up meanwhile
        raise AssertionError("never answered")

    task = asyncio.ensure_future(Pipeline([Credits(store, PRICES)], terminal)(ctx))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entries = [e async for e in ledger_entries(store, LedgerFilter(kind="charge"))]
    assert [(e.usage_source, e.prompt_tokens, e.completion_tokens) for e in entries] == (
        [("relayed", 4, 0)] if reached_upstream else [])
    assert (await store.balance("ann")).held == 0
