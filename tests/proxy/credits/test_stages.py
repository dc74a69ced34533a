"""Identify and Credits in a real pipeline behind a small aiohttp app, called with the openai SDK.

The terminal of the pipeline is ``UpstreamDouble``, a test double of an LLM backend (non-streamed and
streamed chat completions with usage, cache hits, error statuses, broken streams); everything else is the
project's code: ``Pipeline``, the stages, ``respond``, the stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from multidict import CIMultiDict

from normalizer.paths import Target
from proxy.assembly.routes.handler import make_handler
from proxy.auth.identify import Identify
from proxy.auth.keys import KeyStore
from proxy.auth.known_keys import KnownKeys
from proxy.auth.redis_keys import RedisKeyStore
from proxy.auth.sqlite_keys import SqliteKeyStore
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import Dialect, ProxyError
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Pipeline, Stage
from proxy.core.stream_usage import StreamUsage
from proxy.core.usage import Usage
from proxy.credits.pricing import ModelPrice, PriceBook, format_credits
from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.stages import Credits
from proxy.credits.store import CreditStore, LedgerFilter, ledger_entries
from proxy.server.connection import HttpServer
from proxy.server.request import Request
from proxy.server.responder import Responder
from proxy.upstream.client import UpstreamStreamError
from tests.support.processes import RedisServer, free_port, refused_port

CREDIT = 1_000_000
PRICES = PriceBook(
    models={"m": ModelPrice(Decimal("1"), Decimal("2"), Decimal("0.5"))},
    hit_multipliers={"l1": Decimal("0.1"), "l2": Decimal("0.25")},
)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "prompt_tokens_details": {"cached_tokens": 400}}
FULL_COST = PRICES.actual_cost("m", Usage(1000, 500, 400))  # 0.6 + 0.2 + 1.0 = 1.8 credits


@dataclass
class UpstreamDouble:
    """A test double of an LLM backend, as the pipeline's terminal (the forward stage's place)."""

    mode: str = "ok"
    cache_tier: str | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, ctx: RequestContext) -> Reply:
        body = orjson.loads(ctx.outgoing_body())
        self.sent.append(body)
        if self.cache_tier is not None:
            ctx.outcome = Outcome(CacheStatus.HIT, self.cache_tier, Matched.EXACT)
        if self.mode == "error":
            error = {"error": {"message": "backend exploded", "type": "server_error"}}
            return Reply(500, CIMultiDict({"Content-Type": "application/json"}), body=orjson.dumps(error))
        if not body.get("stream"):
            reply = {
                "id": "c1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "usage": USAGE,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "hello"},
                    }
                ],
            }
            return Reply(200, CIMultiDict({"Content-Type": "application/json"}), body=orjson.dumps(reply))
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        return Reply(200, CIMultiDict({"Content-Type": "text/event-stream"}), chunks=self._events(include_usage))

    async def _events(self, include_usage: bool) -> AsyncIterator[bytes]:
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        for word in ("hel", "lo"):
            chunk = {**base, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        if self.mode == "broken":
            raise UpstreamStreamError("LLM backend reset the stream (test)")
        yield b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        yield b"\n\n"
        if include_usage:
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": USAGE}) + b"\n\n"
        yield b"data: [DONE]\n\n"


def server_for(stages: list[Stage], terminal: Callable[[RequestContext], Awaitable[Reply]]) -> HttpServer:
    """The data plane's server running ``stages`` on the chat route, as the proxy does."""
    pipeline = Pipeline(stages, terminal)
    chat = make_handler(pipeline, "chat", Dialect.OPENAI, max_body=1 << 20, json_body=True,
                        target=lambda _request: Target("/v1/chat/completions", {}))

    async def route(request: Request, out: Responder) -> None:
        if request.path != "/v1/chat/completions":
            ProxyError(404, "Not Found").send(out, Dialect.OPENAI)
            return
        await chat(request, out)

    return HttpServer(route, max_body=1 << 20, error_body=lambda *_: b"{}")


@dataclass
class Proxy:
    url: str
    store: CreditStore
    keys: KeyStore
    upstream: UpstreamDouble
    credits: Credits

    def client(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture
async def make_proxy(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Proxy]]]:
    servers: list[HttpServer] = []
    closers: list[Callable[[], Awaitable[None]]] = []

    async def make(
        *,
        store: CreditStore | None = None,
        open_mode: bool = False,
        fail_open: bool = False,
        keys: KeyStore | None = None,
    ) -> Proxy:
        store = store or SqliteCreditStore(tmp_path / "credits.sqlite3")
        keys = keys or SqliteKeyStore(tmp_path / "credits.sqlite3")
        upstream = UpstreamDouble()
        credits = Credits(store, PRICES, fail_open=fail_open)
        server = server_for([Identify(keys, open_mode=open_mode), StreamUsage(), credits], upstream)
        port = free_port()
        await server.start("127.0.0.1", port)
        servers.append(server)
        closers.extend([store.close, keys.close])
        return Proxy(f"http://127.0.0.1:{port}", store, keys, upstream, credits)

    yield make
    for server in servers:
        await server.shutdown(1.0)
    for close in closers:
        await close()


MESSAGES: list[Any] = [{"role": "user", "content": "hello there"}]


async def charges(store: CreditStore, user: str) -> list[Any]:
    return [e async for e in ledger_entries(store, LedgerFilter(user=user, kind="charge"))]


async def test_a_missing_or_wrong_key_is_401(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    proxy = await make_proxy()
    with pytest.raises(openai.AuthenticationError) as caught:
        await proxy.client("rpk_wrong").chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.code == "invalid_api_key"
    assert proxy.upstream.sent == []


async def test_a_revoked_key_is_401(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann")
    await proxy.keys.revoke(created.record.key_id)
    with pytest.raises(openai.AuthenticationError):
        await proxy.client(created.plaintext).chat.completions.create(model="m", messages=MESSAGES)


async def test_open_mode_bills_the_anonymous_user(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    proxy = await make_proxy(open_mode=True)
    await proxy.store.top_up("anonymous", 100 * CREDIT)
    await proxy.client("sk-anything").chat.completions.create(model="m", messages=MESSAGES, max_tokens=600)
    assert [e.cost for e in await charges(proxy.store, "anonymous")] == [FULL_COST]


async def test_insufficient_credit_is_429_insufficient_quota_naming_balance_and_estimate(
    make_proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann", "acme")
    await proxy.store.top_up("ann", CREDIT)
    with pytest.raises(openai.RateLimitError) as caught:
        await proxy.client(created.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10_000)
    error = caught.value
    assert error.status_code == 429 and error.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in error.response.headers
    assert error.code == "insufficient_quota" and error.type == "insufficient_quota"
    estimate = PRICES.worst_case({"messages": MESSAGES, "model": "m", "max_tokens": 10_000}, raw_size=0)
    assert "your balance is 1 credits" in error.message
    assert "may cost up to" in error.message and float(error.message.split("up to ")[1].split()[0]) * CREDIT >= estimate
    assert proxy.upstream.sent == []
    assert (await proxy.store.balance("ann")).available == CREDIT


async def test_a_reply_is_charged_its_usage_with_headers(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann", "acme")
    await proxy.store.top_up("ann", 100 * CREDIT)
    raw = await proxy.client(created.plaintext).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=600
    )
    assert raw.parse().choices[0].message.content == "hello"
    assert raw.headers["X-Credits-Charged"] == format_credits(FULL_COST) == "1.8"
    assert raw.headers["X-Credits-Remaining"] == "98.2"
    account = await proxy.store.balance("ann")
    assert (account.available, account.held) == (100 * CREDIT - FULL_COST, 0)
    [entry] = await charges(proxy.store, "ann")
    assert (
        entry.tenant,
        entry.model,
        entry.tier,
        entry.prompt_tokens,
        entry.completion_tokens,
        entry.cached_tokens,
    ) == ("acme", "m", "upstream", 1000, 500, 400)
    assert entry.request_id == raw.headers["X-Credits-Request-ID"] != raw.headers["X-Request-ID"]


@pytest.mark.parametrize(("tier", "multiplier"), [("l1", Decimal("0.1")), ("l2", Decimal("0.25"))])
async def test_a_cache_hit_costs_its_tier_s_fraction(
    make_proxy: Callable[..., Awaitable[Proxy]], tier: str, multiplier: Decimal
) -> None:
    proxy = await make_proxy()
    proxy.upstream.cache_tier = tier
    created = await proxy.keys.create("ann")
    await proxy.store.top_up("ann", 100 * CREDIT)
    raw = await proxy.client(created.plaintext).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=600
    )
    assert raw.headers["X-Credits-Charged"] == format_credits(int(FULL_COST * multiplier))
    [entry] = await charges(proxy.store, "ann")
    assert entry.tier == tier and entry.cost == int(FULL_COST * multiplier)


async def test_a_stream_is_settled_from_a_usage_chunk_the_client_did_not_ask_for(
    make_proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann")
    await proxy.store.top_up("ann", 100 * CREDIT)
    stream = await proxy.client(created.plaintext).chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=600, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello"
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)
    assert proxy.upstream.sent[0]["stream_options"] == {"include_usage": True}
    assert [e.cost for e in await charges(proxy.store, "ann")] == [FULL_COST]
    assert (await proxy.store.balance("ann")).held == 0


async def test_a_stream_keeps_the_usage_chunk_when_the_client_asked(
    make_proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann")
    await proxy.store.top_up("ann", 100 * CREDIT)
    response = await proxy.client(created.plaintext).chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=600, stream=True, stream_options={"include_usage": True}
    )
    assert response.headers["X-Credits-Remaining"] == format_credits(
        100 * CREDIT - PRICES.worst_case({"model": "m", "max_tokens": 600}, raw_size=len(response.http_request.content))
    )
    chunks = [chunk async for chunk in response.parse()]
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 1000
    assert [e.cost for e in await charges(proxy.store, "ann")] == [FULL_COST]


@pytest.mark.parametrize("mode", ["error", "broken"])
async def test_an_upstream_failure_refunds_the_whole_reservation(
    make_proxy: Callable[..., Awaitable[Proxy]], mode: str
) -> None:
    proxy = await make_proxy()
    proxy.upstream.mode = mode
    created = await proxy.keys.create("ann")
    await proxy.store.top_up("ann", 100 * CREDIT)
    with pytest.raises(openai.APIError):
        stream = await proxy.client(created.plaintext).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=600, stream=mode == "broken"
        )
        if mode == "broken":
            async for _ in stream:  # type: ignore[union-attr]
                pass
    account = await proxy.store.balance("ann")
    assert (account.available, account.held) == (100 * CREDIT, 0)
    assert await charges(proxy.store, "ann") == []


async def test_an_unreachable_store_is_503_with_retry_after(
    make_proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    dead = RedisCreditStore.from_url(f"redis://127.0.0.1:{refused_port()}/0")
    proxy = await make_proxy(store=dead)
    created = await proxy.keys.create("ann")
    with pytest.raises(openai.InternalServerError) as caught:
        await proxy.client(created.plaintext).chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["Retry-After"] == "5"
    assert proxy.upstream.sent == []


async def test_fail_open_serves_unbilled_and_counts(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    dead = RedisCreditStore.from_url(f"redis://127.0.0.1:{refused_port()}/0")
    proxy = await make_proxy(store=dead, fail_open=True)
    created = await proxy.keys.create("ann")
    reply = await proxy.client(created.plaintext).chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "hello"
    assert proxy.credits.unbilled_requests == 1


async def test_the_qdrant_api_key_header_identifies_too(make_proxy: Callable[..., Awaitable[Proxy]]) -> None:
    proxy = await make_proxy()
    created = await proxy.keys.create("ann")
    await proxy.store.top_up("ann", 100 * CREDIT)
    client = openai.AsyncOpenAI(
        base_url=proxy.url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"Authorization": "", "api-key": created.plaintext},
    )
    await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=600)
    assert len(await charges(proxy.store, "ann")) == 1


async def test_known_keys_ride_out_a_key_store_outage_for_their_trust_period(
    make_proxy: Callable[..., Awaitable[Proxy]], tmp_path: Path
) -> None:
    server = RedisServer.start()
    try:
        keys = RedisKeyStore.from_url(server.url)
        now = [1000.0]
        proxy = await make_proxy(keys=keys)
        identify = Identify(keys, known=KnownKeys(ttl_s=30, trust_s=300, clock=lambda: now[0]))
        pipeline_server = server_for([identify, proxy.credits], proxy.upstream)
        port = free_port()
        await pipeline_server.start("127.0.0.1", port)
        url = f"http://127.0.0.1:{port}/v1"
        known, other = await keys.create("ann"), await keys.create("bob")
        await proxy.store.top_up("ann", 100 * CREDIT)

        def client(key: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)

        await client(known.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        server.stop()
        await client(known.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        with pytest.raises(openai.InternalServerError) as caught:
            await client(other.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        assert caught.value.status_code == 503 and "Retry-After" in caught.value.response.headers
        now[0] += 31  # the cache entry expired; the store still down; a known key rides on
        await client(known.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        assert len(await charges(proxy.store, "ann")) == 3
        now[0] += 270  # unconfirmed for longer than outage_key_trust_s: no longer trusted
        with pytest.raises(openai.InternalServerError) as caught:
            await client(known.plaintext).chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        assert caught.value.status_code == 503
        await pipeline_server.shutdown(1.0)
    finally:
        server.stop()
