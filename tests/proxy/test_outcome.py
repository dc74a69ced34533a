"""The outcome on the way back: typed statuses, the charge handed to the metrics as a number, and a streamed
answer's complete body assembled once for every stage that reads it."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import proxy
import proxy.core.endpoints
from normalizer.cache_control import CachePolicy
from proxy.answers.coalesce import Coalesce, Flights
from proxy.answers.replies import StoreResponse
from proxy.answers.stale import StaleIfError, StaleStore
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import CHAT
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Next, Pipeline
from proxy.core.sse import replay
from proxy.observability.metrics import Metrics
from proxy.observability.observe import record_metrics
from proxy.server.request import Request
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier

POLICY = CachePolicy(may_read=True, may_store=True, max_age=None, ttl=None, namespace="docs", force_refresh=False)
ANSWER = {"id": "a", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}


class Keyed:
    """Stands for cache_control and canonicalize: every request is the same request, in a stale-tolerant
    namespace."""

    name = "canonicalize"
    needs: frozenset[str] = frozenset()
    gives = frozenset({"cache_key", "cache_policy"})

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        ctx.cache_key, ctx.cache_policy, ctx.namespace = "k", POLICY, "docs"
        return await call_next(ctx)


def _ctx() -> RequestContext:
    return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id="r",
                          stream=True)


async def test_a_streamed_miss_is_assembled_once_for_every_stage_that_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = replay(ANSWER, include_usage=False)
    assembled: list[bytes] = []
    assemble_stream = proxy.core.endpoints.assemble_stream

    def counted(raw: bytes) -> Any:
        assembled.append(raw)
        return assemble_stream(raw)

    monkeypatch.setattr(proxy.core.endpoints, "assemble_stream", counted)

    async def chunks() -> AsyncIterator[bytes]:
        for event in events:
            yield event

    async def upstream(ctx: RequestContext) -> Reply:
        return Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=chunks())  # type: ignore[arg-type]

    l1 = ResponseTier("l1", MemoryStore(make_policy("lru", 1 << 20)))
    stale = StaleStore()
    pipeline = Pipeline([Keyed(), StaleIfError(stale, endpoint=CHAT, namespaces=["docs"]),
                         StoreResponse(l1, endpoint=CHAT), Coalesce(endpoint=CHAT, wait_s=5.0, flights=Flights())],
                        upstream)
    ctx = _ctx()
    reply = await pipeline(ctx)
    assert reply.chunks is not None
    body = b"".join([chunk async for chunk in reply.chunks])
    await reply.finish(True, body)

    assert assembled == [body], "the store, stale-if-error and coalescing share one assembly"
    assert ctx.outcome == Outcome(CacheStatus.MISS)
    stored, kept = await l1.get("k"), stale.get("k")
    assert stored is not None and kept is not None
    assert stored.body == kept.body
    assert orjson.loads(stored.body)["choices"][0]["message"]["content"] == "hi"


def test_the_charge_reaches_the_metrics_as_a_number_not_through_the_header() -> None:
    metrics = Metrics()
    observe = record_metrics(metrics)
    ctx = _ctx()
    ctx.charged = 1_234_567
    observe(ctx, 200, 0.01)
    ctx = _ctx()
    ctx.outcome, ctx.charged = Outcome(CacheStatus.HIT, "l1", Matched.EXACT), 0
    observe(ctx, 200, 0.01)
    assert metrics.registry.get_sample_value("ragproxy_credits_charged_total", {"kind": "upstream"}) == 1.234567
    assert metrics.registry.get_sample_value("ragproxy_credits_charged_total", {"kind": "hit"}) == 0.0
    exposition = metrics.exposition().decode()
    assert 'cache_status="HIT"' in exposition and 'cache_status="NONE"' in exposition


def test_statuses_are_their_wire_values() -> None:
    assert [str(status) for status in CacheStatus] == [
        "HIT", "SEMANTIC_HIT", "MISS", "REFRESH", "BYPASS", "STALE", "ERROR", "NONE"]
    assert all(status == status.value and f"{status}" == status.value for status in CacheStatus)


def test_no_bare_status_string_is_left_in_the_proxy() -> None:
    """Statuses are written, compared and reported as :class:`CacheStatus` members (``proxy.core.outcome`` alone spells
    them out)."""
    root = Path(proxy.__file__).parent
    values = {status.value for status in CacheStatus}
    bare = [f"{path.relative_to(root)}:{node.lineno} {node.value!r}"
            for path in sorted(root.rglob("*.py")) if path.name != "outcome.py"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value in values]
    assert not bare, bare
