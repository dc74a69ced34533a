"""The client's body is read-only; what goes upstream is that body plus named patches (proxy/core/context.py)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Final, get_args, get_origin

import orjson

import proxy.core.context as context_module
from normalizer.cache_control import split_proxy_fields
from normalizer.json_body import read_body
from proxy.core.context import Reply, RequestContext
from proxy.core.pipeline import Next, Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.core.stream_usage import ask_for_usage
from proxy.credits.stages import RESERVATION
from proxy.credits.store import Reservation
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request


def context(raw: bytes, **slots: Any) -> RequestContext:
    """The context the route handler makes of ``raw`` (read strictly and written again, the proxy's own fields
    lifted out)."""
    parsed, written = read_body(raw)
    body, lifted = split_proxy_fields(parsed)
    return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id="r1",
                          raw_body=raw, body=body, written_body=written, proxy_fields=lifted,
                          stream=bool(body.get("stream")), **slots)


def test_the_body_is_typed_final_and_read_only() -> None:
    """mypy (strict, run on every commit) then refuses any stage reassigning ``ctx.body`` or writing into it."""
    hint = eval(RequestContext.__annotations__["body"], vars(context_module))  # the others name TYPE_CHECKING imports
    assert get_origin(hint) is Final
    (inner,) = get_args(hint)
    assert Mapping[str, Any] in get_args(inner) and not any(get_origin(t) is dict for t in get_args(inner))


def test_without_a_patch_the_body_read_goes_out_written_once() -> None:
    raw = b'{ "stream":false,\n  "model" : "m", "messages":[{"role":"user","content":"caf\\u00e9"}] }'
    ctx = context(raw)
    assert ctx.outgoing_body() is ctx.written_body, "serialised once, by the route handler"
    assert ctx.outgoing_body() == '{"stream":false,"model":"m","messages":[{"role":"user","content":"café"}]}'.encode()
    assert ctx.outgoing_json() is ctx.body


def test_patches_apply_in_order_and_leave_the_clients_body_alone() -> None:
    raw = b'{"model":"m","input":["a","b","c"],"cache":{"ttl":5}}'
    ctx = context(raw)
    client = ctx.body
    ctx.patch("first", lambda sent: {**sent, "input": sent["input"][1:], "step": 1})
    ctx.patch("second", lambda sent: {**sent, "input": sent["input"][1:], "step": sent["step"] + 1})
    assert [patch.name for patch in ctx.patches] == ["first", "second"]
    assert ctx.outgoing_json() == {"model": "m", "input": ["c"], "step": 2}
    assert orjson.loads(ctx.outgoing_body()) == {"model": "m", "input": ["c"], "step": 2}
    assert ctx.body is client and ctx.body == {"model": "m", "input": ["a", "b", "c"]}


def test_lifted_proxy_fields_alone_are_serialised_away() -> None:
    ctx = context(b'{"model":"m", "cache":{"ttl":5}, "input":"x"}')
    assert not ctx.patches and ctx.outgoing_body() == b'{"model":"m","input":"x"}'


class ReadsTheBody:
    """A stage after the patching ones, keeping what ``ctx.body`` was when it ran."""

    name = "reader"
    needs: frozenset[str] = frozenset()
    gives: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.seen: list[Mapping[str, Any] | None] = []

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self.seen.append(ctx.body)
        return await call_next(ctx)


async def test_stages_after_a_patch_read_the_clients_body() -> None:
    """The KV route patches the documents' order and its hints in, credits (from forward) the usage request; the
    stages after them and on the way back read the client's body, the upstream gets the patched one."""
    clock = itertools.count().__next__
    model = PrefillModel(PrefillCoefficients(0.0, 0.0001, 0.0))
    replica = Replica(0, LLAMACPP, KnowledgeTree(100_000, prefill=model, clock=clock), model, AdmissionQueue(2),
                      SlotTable(2, clock=clock))
    reader = ReadsTheBody()
    sent: list[dict[str, Any]] = []

    async def forward(ctx: RequestContext) -> Reply:
        ask_for_usage(ctx)  # what the stream_usage stage does before the rest runs
        reader.seen.append(ctx.body)
        sent.append(orjson.loads(ctx.outgoing_body()))
        return Reply(200, body=b'{"choices":[],"timings":{"cache_n":0,"prompt_n":10,"prompt_ms":5.0}}')

    pipeline = Pipeline([ReadPrompt(None), Shape([replica], default_policy=OrderPolicy.PRESERVE),
                         Route([replica], Router([model], ttft_slo_s=None)), reader], forward)
    documents = [{"id": name, "text": f"document {name} " * 50} for name in ("b", "a")]
    client = {"model": "m", "stream": True,
              "messages": [{"role": "system", "content": "Use them."}, {"role": "user", "content": "q?"}]}
    ctx = context(orjson.dumps({**client, "ragproxy": {"documents": documents}}))
    ctx.handoffs[RESERVATION] = Reservation("r1", "u", amount=1, expires_at=0.0, available_after=0)
    parsed = ctx.body
    await pipeline(ctx)
    assert [patch.name for patch in ctx.patches] == ["route.order", "stream_usage.include_usage"]
    assert reader.seen == [client, client] and all(seen is parsed for seen in reader.seen)
    assert ctx.body is parsed and ctx.body == client
    upstream = sent[0]
    assert upstream["stream_options"] == {"include_usage": True} and upstream["cache_prompt"] is True
    assert upstream["messages"] != client["messages"] and "document a" in upstream["messages"][0]["content"]
    assert {key: upstream[key] for key in ("model", "stream")} == {"model": "m", "stream": True}
