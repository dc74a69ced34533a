"""Shape + Route on ``POST /v1/responses``: replica choice, the body forwarded as sent, reports read back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from normalizer.documents import DocumentRegistry
from normalizer.responses import read_response_prompt
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import RESPONSES
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.handoffs import RoutedRequest
from proxy.kv.kinds import GENERIC, LLAMACPP, OPENAI, SGLANG, VLLM, BackendKind
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import SLO_AT_ARRIVAL, Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.upstream.forward import DESTINATION
from tests.proxy.kv.clocks import Clock
from tests.proxy.kv.test_stages import DOCS, ctx_for, replicas
from upstream_doubles.openai_responses import encode, response_object, stream_events


def routed_of(ctx: RequestContext) -> RoutedRequest:
    """What route gave for ``ctx`` (it must have routed it): forward's destination, a ``RoutedRequest``."""
    routed = ctx.handoffs.get(DESTINATION)
    assert isinstance(routed, RoutedRequest)
    return routed



def registry() -> DocumentRegistry:
    """The documents registered under their names (as a search's point ids would be)."""
    known = DocumentRegistry()
    for name, text in DOCS.items():
        known.add(text, name)
    return known


def response_body(*names: str, instructions: str = "Use the documents.", question: str = "why?",
                  **extra: Any) -> dict[str, Any]:
    """A Responses request whose user message carries the documents ``names`` (recognised from the registry)."""
    context = "\n".join(f"[{i + 1}] {DOCS[n]}" for i, n in enumerate(names))
    text = f"Context:\n{context}\nQuestion: {question}"
    return {"model": "m", "instructions": instructions, "store": False,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}], **extra}


def sent_order(body: dict[str, Any]) -> list[str]:
    text = body["input"][0]["content"][0]["text"]
    return sorted((n for n in DOCS if DOCS[n] in text), key=lambda n: text.index(DOCS[n]))


class ResponsesDouble:
    """Test double of a Responses server: records the bodies it gets and answers a response object (as the API's
    typed events when streamed) reporting ``cached`` of its ``input_tokens`` as cached."""

    def __init__(self, cached: int = 0, input_tokens: int = 1000) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.cached = cached
        self.input_tokens = input_tokens
        self.arrived = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def __call__(self, ctx: RequestContext) -> Reply:
        body = orjson.loads(ctx.outgoing_body())
        self.bodies.append(body)
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        result = response_object(body, "m", [], None, self.input_tokens, 1)
        result["usage"]["input_tokens_details"]["cached_tokens"] = self.cached
        if not body.get("stream"):
            return Reply(200, body=orjson.dumps(result))
        events = b"".join(encode(event) for event in stream_events(result))

        async def chunks() -> AsyncIterator[bytes]:
            yield events

        return Reply(200, chunks=chunks())


def pipeline(reps: list[Replica], router: Router, backend: ResponsesDouble,
             policy: OrderPolicy = OrderPolicy.PRESERVE) -> Pipeline:
    shape = Shape(reps, default_policy=policy)
    return Pipeline([ReadPrompt(registry(), read_response_prompt), shape.serving(RESPONSES),
                     Route(reps, router).serving(RESPONSES)], backend)


async def test_a_responses_prefix_sent_before_goes_to_the_replica_that_holds_it() -> None:
    reps, _ = replicas(2)
    router = Router([r.prefill for r in reps], ttft_slo_s=None, clock=Clock())  # frozen: loads do not drain
    backend = ResponsesDouble()
    run = pipeline(reps, router, backend)
    gate = backend.gate = asyncio.Event()
    busy = asyncio.create_task(run(ctx_for(response_body("d", instructions="Other rules."), 1, "responses")))
    await backend.arrived.wait()  # replica 0 is busy: the next prefix lands on replica 1
    backend.gate = None
    first = ctx_for(response_body("a", "b", "c"), 2, "responses")
    await run(first)
    gate.set()
    await busy
    assert routed_of(first).replica == 1
    again = ctx_for(response_body("a", "b", "c", question="and how?"), 3, "responses")
    await run(again)  # both idle now: only the cached prefix tells them apart
    assert routed_of(again).replica == 1
    assert routed_of(again).predicted.tokens > 0 and reps[0].tree.match(routed_of(again).path).tokens == 0
    assert [s.key for s in routed_of(again).path[1:]] == ["a", "b", "c"]


async def test_a_responses_body_is_forwarded_as_sent_with_its_documents_in_their_order() -> None:
    reps, router = replicas(1)
    backend = ResponsesDouble()
    run = pipeline(reps, router, backend, policy=OrderPolicy.REUSE)  # reuse would reorder a chat prompt
    await run(ctx_for(response_body("a", "b", "c"), 1, "responses"))
    client = response_body("c", "a", "b", text={"format": {"type": "text"}}, x_vendor={"keep": [1, 2]})
    ctx = ctx_for({**client, "ragproxy": {"tags": ["t"]}}, 2, "responses")
    await run(ctx)
    assert backend.bodies[1] == {**client, "cache_prompt": True}, "the client's body, plus the kind's hint"
    assert "messages" not in backend.bodies[1] and sent_order(backend.bodies[1]) == ["c", "a", "b"]
    routed = routed_of(ctx)
    assert [s.key for s in routed.path[1:]] == ["c", "a", "b"]
    assert routed.predicted.tokens == routed.path[0].tokens, "only the instructions match a, b, c"


@pytest.mark.parametrize("kind", [GENERIC, OPENAI, VLLM, SGLANG, LLAMACPP], ids=lambda k: k.name)
async def test_a_responses_body_gets_the_kinds_body_hints_but_no_prompt_cache_key(kind: BackendKind) -> None:
    """The Responses object echoes ``prompt_cache_key``: the client keeps its own (or none), byte for byte."""
    model = PrefillModel(PrefillCoefficients(0.0, 0.0001, 0.0))
    replica = Replica(0, kind, KnowledgeTree(100_000, prefill=model), model, AdmissionQueue(2))
    backend = ResponsesDouble()
    run = pipeline([replica], Router([model], ttft_slo_s=None), backend)
    for n, client in enumerate((response_body("a", "b"), response_body("a", "b", prompt_cache_key="mine"))):
        ctx = ctx_for(client, n, "responses")
        await run(ctx)
        added = backend.bodies[n].keys() - client.keys()
        assert added == {"vllm": {"cache_salt"}, "sglang": {"cache_salt"}, "llamacpp": {"cache_prompt"}}.get(
            kind.name, set())
        assert {key: backend.bodies[n][key] for key in client} == client
        routed = routed_of(ctx)
        assert routed.headers is not None
        assert routed.headers["X-Prefix-Docs"] == "a,b"
        if not added:
            assert not ctx.patches and ctx.outgoing_body() == ctx.raw_body


async def test_a_streamed_responses_reply_corrects_the_tree_from_its_completed_event() -> None:
    reps, router = replicas(1)
    backend = ResponsesDouble(cached=0)  # the backend lost everything
    run = pipeline(reps, router, backend)
    await run(ctx_for(response_body("a", "b"), 1, "responses"))  # (reported no reuse either: a first prefill)
    capacity = reps[0].tree.capacity_tokens = reps[0].tree.size_tokens  # a full tree
    reps[0].tree.min_capacity_tokens = 1
    ctx = ctx_for(response_body("a", "b", question="again?", stream=True), 2, "responses")
    reply = await run(ctx)
    assert reply.chunks is not None
    received = b"".join([chunk async for chunk in reply.chunks])
    assert b"event: response.completed" in received
    await reply.finish(True, received)
    assert ctx.reported_cached_tokens == 0
    assert reps[0].tree.capacity_tokens < capacity
    assert reps[0].queue.active == 0 and router.loads[0].active == 0


async def test_only_responses_whose_state_needs_no_particular_replica_are_routed() -> None:
    """A new stored response may be made anywhere (the proxy records which replica made it); one that continues a
    stored response must reach the replica keeping it: not routed (pinned), bytes untouched."""
    reps, router = replicas(2)
    run = pipeline(reps, router, ResponsesDouble())
    stateless, stored = ctx_for(response_body("a"), 1, "responses"), ctx_for(response_body("a", store=True), 2,
                                                                              "responses")
    continued = ctx_for(response_body("a", previous_response_id="resp_1"), 3, "responses")
    for ctx in (stateless, stored, continued):
        await run(ctx)
    assert stateless.handoffs.get(DESTINATION) is not None
    assert stored.handoffs.get(DESTINATION) is not None
    assert continued.handoffs.get(DESTINATION) is None and continued.outgoing_body() == continued.raw_body


async def test_a_responses_request_no_replica_can_start_in_time_is_a_429() -> None:
    reps, router = replicas(2, slo=0.01)
    backend = ResponsesDouble()
    with pytest.raises(ProxyError) as error:
        await pipeline(reps, router, backend)(ctx_for(response_body("a", "b", "c", "d"), 1, "responses"))
    assert error.value.status == 429 and error.value.code == SLO_AT_ARRIVAL == "ttft_slo"
    assert int(error.value.headers["Retry-After"]) >= 1 and not backend.bodies
