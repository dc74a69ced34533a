"""Billing through an outage of a real redis-server: it is killed mid-run and restarted from its append-only file.

The Credits stage runs in a real Pipeline over the store the runtime builds (:class:`JournaledCreditStore` over
:class:`RedisCreditStore`); the terminal answers like an LLM backend with a usage block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict

from proxy.assembly.config import Settings
from proxy.assembly.credit_components import build_credits
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.usage import Usage
from proxy.credits.journal import JournaledSettlement, SettlementJournal
from proxy.credits.journaled_store import JournaledCreditStore
from proxy.credits.outage import OutageAllowance
from proxy.credits.pricing import ModelPrice, PriceBook, to_micro
from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.replayer import JournalReplayer
from proxy.credits.stages import Credits
from proxy.credits.store import ChargeDetails, CreditStore, LedgerFilter, ledger_entries
from proxy.observability.metrics import Metrics
from proxy.server.request import Request
from tests.support.processes import RedisServer

CREDIT = 1_000_000
PRICES = PriceBook(models={"m": ModelPrice(Decimal("1"), Decimal("1"))})
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
USAGE = {"usage": {"prompt_tokens": 10, "completion_tokens": 20}}
COST = PRICES.actual_cost("m", Usage(10, 20, 0))
ESTIMATE = PRICES.worst_case(BODY, raw_size=len(orjson.dumps(BODY)))


class Redis:
    """A redis-server that keeps every acknowledged write across a kill and restart (AOF, fsync always)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.options = ("--appendonly", "yes", "--appendfsync", "always", "--dir", str(directory))
        self.server = RedisServer.start(None, *self.options)

    @property
    def url(self) -> str:
        return self.server.url

    def kill(self) -> None:
        self.server.process.kill()
        self.server.process.wait()

    def restart(self) -> None:
        self.server.stop()
        self.server = RedisServer.start(self.server.port, *self.options)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path / "redis")
    yield server
    server.server.stop()


def journaled(redis: Redis, tmp_path: Path, allowance: int) -> JournaledCreditStore:
    return JournaledCreditStore(RedisCreditStore.from_url(redis.url, timeout_s=2.0),
                                SettlementJournal(tmp_path / "journal.sqlite3"), OutageAllowance(allowance))


def context(user: str, request_id: str) -> RequestContext:
    return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat",
                          request_id=request_id, raw_body=orjson.dumps(BODY), body=dict(BODY), user=user,
                          tenant="acme")


def answering(before: Callable[[], None] | None = None) -> Callable[[RequestContext], Awaitable[Reply]]:
    async def terminal(ctx: RequestContext) -> Reply:
        if before is not None:
            before()
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=orjson.dumps(USAGE))

    return terminal


async def ask(store: CreditStore, user: str, request_id: str) -> dict[str, Any]:
    """One chat request through the Credits stage: its status and credit headers."""
    ctx = context(user, request_id)
    try:
        reply = await Pipeline([Credits(store, PRICES)], answering())(ctx)
    except ProxyError as exc:
        return {"status": exc.status, "code": exc.code}
    return {"status": reply.status, **ctx.response_headers}


async def ask_until_refused(store: CreditStore, user: str, limit: int = 100) -> list[str]:
    """Requests admitted before the first refusal (which must be 503 credit_store_unavailable)."""
    admitted: list[str] = []
    for i in range(limit):
        answer = await ask(store, user, f"{user}-outage-{i}")
        if answer["status"] != 200:
            assert answer == {"status": 503, "code": "credit_store_unavailable"}
            return admitted
        assert answer["X-Credits-Charged"] == str(Decimal(COST) / CREDIT)
        admitted.append(answer["X-Credits-Request-ID"])  # the ledger key: the proxy's own id
    raise AssertionError("the allowance never ran out")


def admissions(budget: int) -> int:
    """How many sequential requests a budget admits: each needs its worst case on top of what the others cost."""
    return 0 if budget < ESTIMATE else (budget - ESTIMATE) // COST + 1


async def charges(store: CreditStore, user: str) -> list[tuple[str, int, int]]:
    return [(e.request_id, e.cost, e.shortfall)
            async for e in ledger_entries(store, LedgerFilter(user=user, kind="charge"))]


async def test_requests_ride_out_an_outage_on_the_allowance_and_are_billed_once_redis_is_back(
    redis: Redis, tmp_path: Path,
) -> None:
    allowance = CREDIT // 2
    serving = journaled(redis, tmp_path, allowance)
    await serving.top_up("ann", 10 * CREDIT)
    await serving.top_up("bob", 3 * ESTIMATE // 2)
    await serving.store.top_up("cy", 10 * CREDIT)  # cy has credit, but this replica never saw his balance
    before = {user: await ask(serving, user, f"{user}-before") for user in ("ann", "bob")}
    assert [answer["status"] for answer in before.values()] == [200, 200]

    redis.kill()
    admitted = {user: await ask_until_refused(serving, user) for user in ("ann", "bob")}
    ann_known, bob_known = 10 * CREDIT - COST, 3 * ESTIMATE // 2 - COST
    assert len(admitted["ann"]) == admissions(min(ann_known, allowance)) > 1
    assert len(admitted["bob"]) == admissions(min(bob_known, allowance)) >= 1, "bob's balance is the cap"
    assert await ask(serving, "cy", "cy-1") == {"status": 503, "code": "credit_store_unavailable"}
    journaled_count = len(admitted["ann"]) + len(admitted["bob"])
    assert (serving.admitted, serving.refused, serving.journaled) == (journaled_count, 3, journaled_count)
    await serving.close()  # this proxy stops while Redis is still down

    redis.restart()
    direct = RedisCreditStore.from_url(redis.url, timeout_s=2.0)
    await direct.reserve("bob-elsewhere", "bob", bob_known - COST // 2, 60)  # another replica spent bob's credit
    await direct.settle("bob-elsewhere", "bob", bob_known - COST // 2, ChargeDetails())
    restarted = journaled(redis, tmp_path, allowance)
    replayer = JournalReplayer(restarted, interval_s=0.05)
    await replayer.start()
    assert restarted.journal.depth == journaled_count, "the new process found the previous one's journal"
    for _ in range(200):
        if restarted.journal.depth == 0:
            break
        await asyncio.sleep(0.05)
    await replayer.stop()
    assert restarted.journal.depth == 0

    ann = await charges(direct, "ann")
    # (replay runs in parallel batches: the replayed entries' order among themselves is not fixed)
    assert ann[0] == (before["ann"]["X-Credits-Request-ID"], COST, 0)
    assert sorted(ann[1:]) == sorted((rid, COST, 0) for rid in admitted["ann"])
    account = await direct.balance("ann")
    assert (account.available, account.held) == (10 * CREDIT - COST * len(ann), 0)
    bob = await charges(direct, "bob")
    assert [rid for rid, _, _ in bob[:2]] == [before["bob"]["X-Credits-Request-ID"], "bob-elsewhere"]
    assert sorted(rid for rid, _, _ in bob[2:]) == sorted(admitted["bob"])
    replayed_bob = bob[2:]
    assert sum(cost for _, cost, _ in replayed_bob) == COST // 2, "capped at what was left"
    assert sum(cost + shortfall for _, cost, shortfall in replayed_bob) == COST * len(admitted["bob"])
    account = await direct.balance("bob")
    assert (account.available, account.held) == (0, 0), "the balance never goes negative"
    assert await charges(direct, "cy") == []
    await restarted.close()
    await direct.close()


async def test_a_request_reserved_before_the_outage_is_settled_against_its_hold(
    redis: Redis, tmp_path: Path,
) -> None:
    store = journaled(redis, tmp_path, CREDIT)
    await store.top_up("ann", 10 * CREDIT)
    ctx = context("ann", "in-flight")
    await Pipeline([Credits(store, PRICES)], answering(before=redis.kill))(ctx)
    assert ctx.response_headers["X-Credits-Charged"] == str(Decimal(COST) / CREDIT)
    assert store.journal.depth == 1
    redis.restart()
    assert await JournalReplayer(store).drain() == 1
    assert store.replayed == {"settled": 1}
    account = await store.balance("ann")
    assert (account.available, account.held) == (10 * CREDIT - COST, 0)
    assert await charges(store, "ann") == [(ctx.response_headers["X-Credits-Request-ID"], COST, 0)]
    await store.close()


async def test_a_zero_allowance_refuses_at_once(redis: Redis, tmp_path: Path) -> None:
    store = journaled(redis, tmp_path, 0)
    await store.top_up("ann", 10 * CREDIT)
    assert (await ask(store, "ann", "before"))["status"] == 200
    redis.kill()
    assert await ask(store, "ann", "during") == {"status": 503, "code": "credit_store_unavailable"}
    assert (store.admitted, store.refused) == (0, 1)
    await store.close()


async def test_the_runtime_builds_a_journaled_store_and_exports_its_figures(tmp_path: Path) -> None:
    settings = Settings.model_validate({"data_dir": str(tmp_path), "auth": {"mode": "keys"},
                                        "credits": {"enabled": True, "outage_allowance": "0.25"}})
    components = build_credits(settings)
    store = components.store
    assert isinstance(store, JournaledCreditStore)
    assert store.allowance.allowance == to_micro("0.25")
    assert store.journal.path == tmp_path / "credit-journal.sqlite3"
    metrics = Metrics()
    components.register_metrics(metrics)
    await components.start()
    await store.journal.append(JournaledSettlement("r1", "nobody", CREDIT, ChargeDetails(), 1.0))
    text = metrics.exposition().decode()
    assert "ragproxy_credit_journal_depth 1.0" in text
    assert 'ragproxy_credit_outage_admissions_total{result="refused"} 0.0' in text
    assert 'ragproxy_credit_journal_settlements_total{event="journaled",outcome=""} 0.0' in text
    await components.stop()  # the final drain settles it: the embedded store is up
    assert store.replayed == {"no_account": 1}
