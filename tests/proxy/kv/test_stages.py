"""Shape + Route stages run as a pipeline in front of a test double of a llama.cpp backend."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from typing import Any

import orjson
import pytest

from normalizer.cache_control import split_proxy_fields
from normalizer.documents import DocumentRegistry, read_prompt
from normalizer.prompt_plan import estimate_tokens
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.handoffs import SHAPED, RoutedRequest
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import GENERIC, LLAMACPP, OPENAI, SGLANG, VLLM, BackendKind
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request
from proxy.upstream.forward import DESTINATION

DOCS = {name: " ".join(f"{name}{i}" for i in range(200)) for name in "abcd"}

def routed_of(ctx: RequestContext) -> RoutedRequest:
    """What route gave for ``ctx`` (it must have routed it): forward's destination, a ``RoutedRequest``."""
    routed = ctx.handoffs.get(DESTINATION)
    assert isinstance(routed, RoutedRequest)
    return routed



def replicas(n: int, slo: float | None = None) -> tuple[list[Replica], Router]:
    clock = itertools.count().__next__
    models = [PrefillModel(PrefillCoefficients(0.0, 0.0001, 0.0)) for _ in range(n)]
    reps = [
        Replica(
            i,
            LLAMACPP,
            KnowledgeTree(100_000, prefill=m, clock=clock),
            m,
            AdmissionQueue(2),
            SlotTable(2, clock=clock),
        )
        for i, m in enumerate(models)
    ]
    return reps, Router(models, ttft_slo_s=slo)


class LlamaDouble:
    """Test double of llama-server: records bodies, reports ``cache_n`` as the given value."""

    def __init__(self, cache_n: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.cache_n = cache_n

    async def __call__(self, ctx: RequestContext) -> Reply:
        self.bodies.append(orjson.loads(ctx.outgoing_body()))
        timings = {"cache_n": self.cache_n, "prompt_n": 100, "prompt_ms": 50.0}
        return Reply(200, body=orjson.dumps({"choices": [], "timings": timings}))


def ctx_for(body: dict[str, Any], n: int, route: str = "chat") -> RequestContext:
    """The context the route handler makes for ``route`` (``chat`` or ``responses``): the proxy's own fields lifted
    out of the body."""
    request = Request("POST", "/v1/responses" if route == "responses" else "/v1/chat/completions")
    forwarded, lifted = split_proxy_fields(body)
    return RequestContext(request=request, route=route, request_id=f"r{n}", raw_body=orjson.dumps(body),
                          body=forwarded, proxy_fields=lifted,
                          stream=bool(body.get("stream")))


def structured(*names: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "Use the documents."}, {"role": "user", "content": "q?"}],
        "ragproxy": {"documents": [{"id": n, "text": DOCS[n]} for n in names]},
    }


def doc_order(body: dict[str, Any]) -> list[str]:
    system = body["messages"][0]["content"]
    return sorted("abcd", key=lambda n: system.find(f'id="{n}"') if f'id="{n}"' in system else 1 << 30)[
        : system.count("<document ")
    ]


async def test_same_documents_in_another_order_go_to_the_warm_replica_in_its_order() -> None:
    reps, router = replicas(2)
    backend = LlamaDouble()
    shape = Shape(reps, default_policy=OrderPolicy.REUSE)
    pipeline = Pipeline([ReadPrompt(None), shape, Route(reps, router, expose_headers=True)], backend)
    first = ctx_for(structured("a", "b", "c"), 1)
    await pipeline(first)
    warm = routed_of(first).replica
    second = ctx_for(structured("c", "a", "b"), 2)  # top-ranked is c
    await pipeline(second)
    assert routed_of(second).replica == warm
    assert doc_order(backend.bodies[1]) == ["a", "b", "c"]  # cached path a, b; top c at the end
    assert "ragproxy" not in backend.bodies[1]
    assert backend.bodies[1]["cache_prompt"] is True
    assert backend.bodies[1]["id_slot"] == routed_of(second).slot  # the slot holding a, b, c
    assert routed_of(second).headers is not None and routed_of(second).headers["X-Prefix-Docs"] == "a,b,c"
    assert int(second.response_headers["X-RagProxy-Cached-Tokens-Estimate"]) > 0
    assert router.loads[warm].active == 0 and reps[warm].queue.active == 0


async def test_preserve_keeps_the_client_order() -> None:
    reps, router = replicas(1)
    backend = LlamaDouble()
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)],
                        backend)
    await pipeline(ctx_for(structured("a", "b", "c"), 1))
    await pipeline(ctx_for(structured("c", "a", "b"), 2))
    assert doc_order(backend.bodies[1]) == ["c", "a", "b"]


async def test_detected_documents_are_reordered_in_place() -> None:
    reps, router = replicas(1)
    registry = DocumentRegistry()
    for text in DOCS.values():
        registry.add(text)
    backend = LlamaDouble()
    pipeline = Pipeline([ReadPrompt(registry), Shape(reps, default_policy=OrderPolicy.REUSE), Route(reps, router)],
                        backend)

    def body(*names: str) -> dict[str, Any]:
        context = "\n".join(f"[{i + 1}] {DOCS[n]}" for i, n in enumerate(names))
        return {
            "model": "m",
            "messages": [{"role": "user", "content": f"Context:\n{context}\nQuestion: why?"}],
        }

    await pipeline(ctx_for(body("a", "b", "c"), 1))
    second = ctx_for(body("b", "c", "a"), 2)
    await pipeline(second)  # top b; cached path a, b, c -> a, c, b
    sent = backend.bodies[1]["messages"][0]["content"]
    reordered = body("a", "c", "b")["messages"][0]["content"]  # the labels stay: [1] a, [2] c, [3] b ...
    hint = "\nRelevance order of the passages above, most relevant first: 3, 2, 1."  # ... b was first, a last
    assert sent == reordered.replace("\nQuestion:", hint + "\nQuestion:")
    # the hint is part of what the backend computes: its tokens count in the length the TTFT was estimated on
    plan = second.handoffs[SHAPED].plan
    sent_as_retrieved = plan.prefix.tokens + sum(d.tokens for d in plan.documents) + plan.tail_tokens
    assert routed_of(second).total_tokens == sent_as_retrieved + estimate_tokens(hint) > sent_as_retrieved


async def test_no_replica_within_the_slo_is_a_429_with_retry_after() -> None:
    reps, router = replicas(2, slo=0.01)
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)],
                        LlamaDouble())
    with pytest.raises(ProxyError) as error:
        await pipeline(ctx_for(structured("a", "b", "c", "d"), 1))
    assert error.value.status == 429 and int(error.value.headers["Retry-After"]) >= 1


async def test_a_malformed_document_is_a_400() -> None:
    reps, router = replicas(1)
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)],
                        LlamaDouble())
    body = {"messages": [{"role": "user", "content": "q"}], "ragproxy": {"documents": [{"id": "x"}]}}
    with pytest.raises(ProxyError) as error:
        await pipeline(ctx_for(body, 1))
    assert error.value.status == 400


async def test_reported_cache_shortfall_corrects_the_tree_and_feeds_the_prefill_model() -> None:
    reps, router = replicas(1)
    backend = LlamaDouble(cache_n=0)
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.REUSE), Route(reps, router)], backend)
    await pipeline(ctx_for(structured("a", "b"), 1))
    capacity = reps[0].tree.capacity_tokens = reps[0].tree.size_tokens  # a full tree
    reps[0].tree.min_capacity_tokens = 1
    ctx = ctx_for(structured("a", "b"), 2)
    await pipeline(ctx)
    assert ctx.reported_cached_tokens == 0
    assert reps[0].tree.capacity_tokens < capacity


async def test_the_tree_forgets_what_a_reused_slot_truncates_without_saving() -> None:
    """llama.cpp reuses the slot holding a, b, c as it is for a, b, d (it keeps more than half of its prompt) and
    truncates c without saving it to its prompt cache: the tree must not predict c cached any longer."""
    reps, router = replicas(1)
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)],
                        LlamaDouble(cache_n=10_000))
    first = ctx_for(structured("a", "b", "c"), 1)
    await pipeline(first)
    held = routed_of(first).path
    assert reps[0].tree.match(held).tokens == sum(segment.tokens for segment in held)
    await pipeline(ctx_for(structured("a", "b", "d"), 2))
    assert reps[0].tree.match(held).segments == len(held) - 1


async def test_a_queued_request_takes_the_slot_that_frees_first_not_the_one_guessed_at_routing() -> None:
    """Under load every slot is busy when a request is routed; the server takes whichever slot frees first when
    the request leaves the queue. The slot table must record that one: a guess made at routing time (the busy slot
    holding the same documents) leaves the table following a slot the server did not use."""
    reps, router = replicas(1)
    gates: dict[str, asyncio.Event] = {}

    async def held(ctx: RequestContext) -> Reply:
        await gates.setdefault(ctx.request_id, asyncio.Event()).wait()
        return Reply(200, body=b'{"choices": []}')

    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)],
                        held)
    a, b, c = ctx_for(structured("a", "b"), 1), ctx_for(structured("c", "d"), 2), ctx_for(structured("a", "b"), 3)
    flights = [asyncio.create_task(pipeline(ctx)) for ctx in (a, b)]
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(pipeline(c))  # both slots busy: c waits in the queue
    await asyncio.sleep(0.01)
    assert routed_of(a).slot != routed_of(b).slot
    gates.setdefault("r2", asyncio.Event()).set()  # b finishes first: its slot is the one the server gives c
    await flights[1]
    await asyncio.sleep(0.01)
    assert routed_of(c).slot == routed_of(b).slot
    for gate in ("r1", "r3"):
        gates.setdefault(gate, asyncio.Event()).set()
    await asyncio.gather(flights[0], queued)


async def test_shift_orders_like_reuse_and_asks_llamacpp_for_chunk_reuse() -> None:
    reps, router = replicas(1)
    backend = LlamaDouble()
    shape = Shape(reps, default_policy=OrderPolicy.REUSE, policies={"fast": OrderPolicy.SHIFT})
    pipeline = Pipeline([ReadPrompt(None), shape, Route(reps, router, shift_min_tokens=32)], backend)
    await pipeline(ctx_for(structured("a", "b", "c"), 1))
    plain, shifted = ctx_for(structured("c", "a", "b"), 2), ctx_for(structured("c", "a", "b"), 3)
    shifted.namespace = "fast"
    await pipeline(plain)
    await pipeline(shifted)
    assert "n_cache_reuse" not in backend.bodies[1]
    assert backend.bodies[2]["n_cache_reuse"] == 32
    assert doc_order(backend.bodies[2]) == doc_order(backend.bodies[1]) == ["a", "b", "c"]


@pytest.mark.parametrize(("policy", "grows"), [(OrderPolicy.REUSE, True), (OrderPolicy.SHIFT, False)])
async def test_reuse_beyond_the_prefix_grows_the_tree_only_when_nothing_was_shifted(
    policy: OrderPolicy, grows: bool
) -> None:
    reps, router = replicas(1)
    backend = LlamaDouble(cache_n=10_000)  # the backend reused nearly all of a prompt the tree had never seen
    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=policy), Route(reps, router)], backend)
    capacity = reps[0].tree.capacity_tokens
    await pipeline(ctx_for(structured("a", "b"), 1))
    assert (reps[0].tree.capacity_tokens > capacity) is grows


async def test_a_one_message_prompt_keeps_its_bytes_and_a_system_prompt_names_its_prefix() -> None:
    model = PrefillModel(PrefillCoefficients(0.0, 0.0001, 0.0))
    replica = Replica(0, OPENAI, KnowledgeTree(100_000, prefill=model), model, AdmissionQueue(2), None)
    sent: list[RequestContext] = []

    async def backend(ctx: RequestContext) -> Reply:
        sent.append(ctx)
        return Reply(200, body=b'{"choices":[],"usage":{"prompt_tokens":3}}')

    route = Route([replica], Router([model], ttft_slo_s=None))
    pipeline = Pipeline([ReadPrompt(None), Shape([replica], default_policy=OrderPolicy.PRESERVE), route], backend)
    alone = {"model": "m", "messages": [{"role": "user", "content": "q?"}]}
    await pipeline(ctx_for(alone, 1))
    assert not sent[0].patches and sent[0].outgoing_body() == orjson.dumps(alone)
    assert sent[0].body is not None
    assert "prompt_cache_key" not in orjson.loads(sent[0].outgoing_body()) and not routed_of(sent[0]).headers
    assert replica.tree.node_count == 0, "nothing before the question: nothing to remember"
    for n, question in enumerate(("q?", "another q?"), start=2):
        body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": question}]}
        await pipeline(ctx_for(body, n))
    keys = [orjson.loads(ctx.outgoing_body())["prompt_cache_key"] for ctx in sent[1:]]
    assert keys[0] == keys[1], "the same system prompt, the same prefix key"
    hints = routed_of(sent[1]).headers
    assert hints is not None and hints["X-Prefix-Hash"] == keys[0]
    assert replica.tree.node_count == 1


@pytest.mark.parametrize("kind", [OPENAI, GENERIC])
async def test_a_one_message_prompt_to_the_only_replica_routes_as_the_full_decision_would(kind: BackendKind) -> None:
    model = PrefillModel(PrefillCoefficients(0.01, 0.0001, 0.0))
    replica = Replica(0, kind, KnowledgeTree(100_000, prefill=model), model, AdmissionQueue(2))
    route = Route([replica], Router([model], ttft_slo_s=None))
    shape = Shape([replica], default_policy=OrderPolicy.PRESERVE)
    body = {"model": "m", "messages": [{"role": "user", "content": "What does a proxy do?"}]}
    decided = []
    for fixed in (True, False):
        route._fixed = fixed
        ctx = ctx_for(dict(body), 0)
        ctx.prompt = read_prompt(body)
        shape.shape(ctx)
        routed = route.route(ctx)
        assert routed is not None and routed is ctx.handoffs.get(DESTINATION)
        patched = [patch.name for patch in ctx.patches]
        decided.append((replace(routed, ticket=""), patched, replica.tree.match([]).tokens))
    assert route._fixed is False and decided[0] == decided[1]
    assert decided[0][0].replica == 0 and decided[0][0].estimated_ttft_s > 0


async def test_requests_sharing_a_client_request_id_are_counted_apart() -> None:
    """Clients reuse X-Request-ID: the router's load must count each request in flight, and forget each one."""
    reps, router = replicas(2)  # (one replica without an SLO tracks no load)
    release = asyncio.Event()

    async def slow(ctx: RequestContext) -> Reply:
        await release.wait()
        return Reply(200, body=b'{"choices": []}')

    pipeline = Pipeline([ReadPrompt(None), Shape(reps, default_policy=OrderPolicy.PRESERVE), Route(reps, router)], slow)
    same = [ctx_for(structured("a", "b"), 1) for _ in range(3)]  # three on two replicas: two share one
    assert len({ctx.request_id for ctx in same}) == 1
    flights = [asyncio.create_task(pipeline(ctx)) for ctx in same]
    await asyncio.sleep(0.01)
    assert sum(len(load.outstanding) for load in router.loads) == 3
    release.set()
    await asyncio.gather(*flights)
    assert not any(load.outstanding for load in router.loads)


def test_the_fixed_route_is_only_taken_where_nothing_is_left_to_decide() -> None:
    def fixed(kind: BackendKind, n: int = 1, slo: float | None = None, expose: bool = False) -> bool:
        models = [PrefillModel() for _ in range(n)]
        reps = [Replica(i, kind, KnowledgeTree(1000, prefill=m), m, AdmissionQueue(2)) for i, m in enumerate(models)]
        return Route(reps, Router(models, ttft_slo_s=slo), expose_headers=expose)._fixed

    assert fixed(OPENAI) and fixed(GENERIC)
    assert not fixed(VLLM) and not fixed(SGLANG) and not fixed(LLAMACPP)
    assert not fixed(OPENAI, n=2)
    assert not fixed(OPENAI, slo=1.0)
    assert not fixed(OPENAI, expose=True)


def test_route_placed_before_shape_is_refused() -> None:
    """The KV layer's handoffs are keys of its own (proxy.kv.handoffs), checked at assembly like the context's
    slots."""
    reps, router = replicas(2)
    assert SHAPED in Shape.gives and SHAPED in Route.needs
    with pytest.raises(ValueError, match=r"'route' needs \['shape'\], which no earlier stage gives"):
        Pipeline([ReadPrompt(None), Route(reps, router), Shape(reps, default_policy=OrderPolicy.PRESERVE)],
                 LlamaDouble())


def test_the_shape_stage_has_no_order_of_its_own() -> None:
    """The order of a namespace without one is ``routing.order``, whose default the settings hold: the stage takes
    it and has no second default to differ from it."""
    with pytest.raises(TypeError, match="default_policy"):
        Shape([])  # type: ignore[call-arg]
