"""llama.cpp slot choice (SlotTable.choose), reading ``/slots`` (discovery), and backend token counts converted
into the tree's estimates by the Route stage."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from normalizer.prompt_plan import Segment
from proxy.core.context import Reply, RequestContext
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.handoffs import RoutedRequest
from proxy.kv.hints import Lost, SlotChoice, SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request
from proxy.upstream.client import UpstreamClient
from proxy.upstream.forward import DESTINATION

SYS = Segment("p:s", 20)
HOT = [SYS, Segment("hot1", 400), Segment("hot2", 400)]


def d(name: str) -> Segment:
    return Segment(name, 400)


def table(prompt_cache: bool) -> SlotTable:
    return SlotTable(2, prompt_cache=prompt_cache, clock=itertools.count().__next__)


def test_with_a_prompt_cache_the_servers_own_rule_chooses_and_a_slot_holding_a_prompt_is_pinned() -> None:
    """The slot is the one llama.cpp's own rule would take; it is pinned, so that requests reaching the server in
    another order than they started still get it, unless it is empty (a pinned empty slot restores nothing)."""
    slots = table(prompt_cache=True)
    first = slots.choose(HOT, 900)
    assert not first.pin and first.slot == 1  # fresh server: equal LRU times, llama.cpp takes the last slot
    slots.assign(first.slot, HOT)
    slots.release(first.slot)
    again = slots.choose([*HOT, d("x")], 1300)
    assert (again.slot, again.reused, again.pin) == (1, 820, True)  # the server's similarity choice
    other = slots.choose([SYS, d("cold")], 500)  # shares only the system prompt: the server's LRU slot, empty
    assert (other.slot, other.pin) == (0, False)
    slots.assign(other.slot, [SYS, d("cold")], 500)
    slots.release(other.slot)
    assert slots.choose([SYS, d("new")], 500).pin, "both slots hold prompts now"


def test_without_a_prompt_cache_a_one_off_prompt_overwrites_the_cheapest_slot_not_the_popular_one() -> None:
    slots = table(prompt_cache=False)
    tree = KnowledgeTree(100_000)
    for _ in range(3):  # a popular path
        tree.insert(HOT)
    choice = slots.choose(HOT, 900, value=tree.reuse_value)
    assert choice.pin and choice.slot == 0  # empty slots first
    slots.assign(0, HOT)
    slots.release(0)
    one_off = [SYS, d("a"), d("b")]
    tree.insert(one_off)
    choice = slots.choose(one_off, 900, value=tree.reuse_value)
    assert (choice.slot, choice.pin) == (1, True)
    slots.assign(1, one_off)
    slots.release(1)
    # the popular slot is now the least recently used one; another one-off still goes to the cheap slot
    another = [SYS, d("c"), d("e")]
    tree.insert(another)
    assert tree.reuse_value(one_off) == 0 < tree.reuse_value(HOT)
    choice = slots.choose(another, 900, value=tree.reuse_value)
    assert (choice.slot, choice.pin) == (1, True)
    # a prompt extending the popular path is pinned to the slot holding it
    choice = slots.choose([*HOT, d("f")], 1300, value=tree.reuse_value)
    assert (choice.slot, choice.reused, choice.pin) == (0, 820, True)


def test_sharing_only_the_system_prompt_is_no_reason_to_overwrite_a_popular_slot() -> None:
    slots = table(prompt_cache=False)
    system = Segment("p:long", 300)  # 300 of ~1,100 tokens: above the similarity on its own
    hot = [system, d("hot1"), d("hot2")]
    tree = KnowledgeTree(100_000)
    for _ in range(3):
        tree.insert(hot)
    slots.assign(0, hot)
    slots.release(0)
    one_off = [system, d("a"), d("b")]
    choice = slots.choose(one_off, 1100, value=tree.reuse_value)
    assert (choice.slot, choice.pin) == (1, True)


def test_busy_slots_are_not_chosen() -> None:
    slots = table(prompt_cache=False)
    slots.assign(0, HOT)  # still running
    choice = slots.choose([*HOT, d("x")], 1300)
    assert choice.slot == 1 and choice.reused == 0


def test_resize_follows_the_servers_slot_count_and_keeps_what_known_slots_hold() -> None:
    slots = table(prompt_cache=False)
    slots.assign(0, HOT)
    slots.release(0)
    slots.resize(4)
    assert len(slots) == 4 and slots.best(HOT) == (0, 820)
    slots.resize(1)
    assert len(slots) == 1
    with pytest.raises(ValueError):
        slots.resize(0)


# --- /slots ------------------------------------------------------------------------------------------------


def test_apply_slots_sets_slots_the_requests_in_flight_and_at_least_the_servers_kv() -> None:
    tree = KnowledgeTree(10_000)
    queue = AdmissionQueue(64)
    slots = SlotTable(1)
    answer = [{"id": i, "n_ctx": 8192, "is_processing": False} for i in range(3)]
    assert apply_slots(answer, tree=tree, queue=queue, slot_table=slots) == (3, 3 * 8192)
    assert len(slots) == 3 and queue.limit == 3  # no more in flight than the server has slots
    few = AdmissionQueue(2)
    apply_slots(answer, tree=tree, queue=few)
    assert few.limit == 2  # nor more than configured
    assert tree.capacity_tokens == 3 * 8192 and tree.max_capacity_tokens >= 4 * 3 * 8192
    big = KnowledgeTree(200_000)
    apply_slots(answer, tree=big)
    assert big.capacity_tokens == 200_000  # the configured value stands for what host memory keeps too
    assert apply_slots([], tree=tree) is None
    assert apply_slots([{"id": 0, "n_ctx": "many"}], tree=tree) is None


async def _serve(handler: Any) -> TestServer:
    app = web.Application()
    app.router.add_get("/slots", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_read_slots_returns_the_answer_or_none_when_the_server_has_no_slots_endpoint() -> None:
    async def slots(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == "Bearer k"
        return web.json_response([{"id": 0, "n_ctx": 4096}, {"id": 1, "n_ctx": 4096}])

    async def disabled(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "This server does not support slots endpoint."}}, status=501)

    good, off = await _serve(slots), await _serve(disabled)
    client = UpstreamClient(connect_timeout=1, read_timeout=2, pool_size=2)
    try:
        answer = await read_slots(client, str(good.make_url("/")), {"Authorization": "Bearer k"})
        assert answer is not None and len(answer) == 2
        assert await read_slots(client, str(off.make_url("/")), {}) is None
        assert await read_slots(client, "http://127.0.0.1:9", {}, timeout_s=0.5) is None
    finally:
        await client.close()
        await good.close()
        await off.close()


async def test_route_reads_slots_of_llamacpp_backends_in_the_background() -> None:
    async def slots(request: web.Request) -> web.Response:
        return web.json_response([{"id": i, "n_ctx": 50_000} for i in range(4)])

    server = await _serve(slots)

    class Backend:
        url = str(server.make_url("/")).rstrip("/")

        def auth_headers(self) -> dict[str, str]:
            return {}

    model = PrefillModel()
    replica = Replica(0, LLAMACPP, KnowledgeTree(10_000, prefill=model), model, AdmissionQueue(2),
                      SlotTable(1))
    router = Router([model], ttft_slo_s=None)
    client = UpstreamClient(connect_timeout=1, read_timeout=2, pool_size=2)
    route = Route([replica], router, backend_objects=[Backend()], client=client)
    try:
        await route.discover()
    finally:
        await client.close()
        await server.close()
    assert len(replica.slots or []) == 4 and replica.queue.limit == 2  # the configured limit, under 4 slots
    assert router.loads[0].parallelism == 1  # the slots' prompts are computed one after the other
    assert replica.tree.capacity_tokens == 200_000


# --- backend tokens into tree tokens -----------------------------------------------------------------------


class TwiceAsManyTokens:
    """A backend whose tokenizer counts twice the proxy's estimate, reporting exactly what the tree predicted."""

    def __init__(self, route: Route) -> None:
        self.route = route

    async def __call__(self, ctx: RequestContext) -> Reply:
        routed = ctx.handoffs.get(DESTINATION)
        assert isinstance(routed, RoutedRequest)
        cached = 2 * routed.predicted.tokens
        computed = 2 * routed.total_tokens - cached
        timings = {"cache_n": cached, "prompt_n": computed, "prompt_ms": 10.0}
        return Reply(200, body=orjson.dumps({"choices": [], "timings": timings}))


async def test_reports_in_backend_tokens_are_converted_before_correcting_the_tree() -> None:
    model = PrefillModel(PrefillCoefficients(0.0, 0.0001, 0.0))
    tree = KnowledgeTree(100_000, prefill=model, grow_factor=2.0)
    replica = Replica(0, LLAMACPP, tree, model, AdmissionQueue(2), SlotTable(2))
    route = Route([replica], Router([model], ttft_slo_s=None))
    pipeline = Pipeline([ReadPrompt(None), Shape([replica], default_policy=OrderPolicy.REUSE), route],
                        TwiceAsManyTokens(route))
    docs = [{"id": n, "text": " ".join(f"{n}{i}" for i in range(150))} for n in "ab"]
    for n in range(3):
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]}
        ctx = RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id=f"r{n}",
                             raw_body=orjson.dumps(body), body=body, proxy_fields={"ragproxy": {"documents": docs}})
        assert (await pipeline(ctx)).status == 200
    reported = ctx.reported_cached_tokens
    assert reported is not None and reported > 0
    assert tree.capacity_tokens == 100_000  # neither a surplus nor a shortfall once converted


def test_with_a_prompt_cache_a_longer_cached_prefix_is_restored_through_a_slot_that_keeps_less_than_half() -> None:
    """llama.cpp restores from its prompt cache only into a slot that would keep less than half of its prompt: a
    similar slot that keeps more is reused as it is, so the request goes to another slot, pinned, when the cache
    holds more than the similar slot does; with no such slot, reuse is bounded by the similar slot's prefix."""
    slots = table(prompt_cache=True)
    near = [SYS, d("a"), d("b"), d("c")]
    slots.assign(0, near, 1300)
    slots.release(0)
    asked = [SYS, d("a"), d("b"), d("x")]  # shares 820 of slot 0's 1,300: it would keep 63%, restoring nothing
    alone = slots.choose(asked, 1300, cached_tokens=1220)
    assert (alone.slot, alone.pin, alone.reused) == (0, True, 820), "slot 1 is empty: nothing to save there"
    slots.assign(1, [SYS, d("y"), d("z")], 900)
    slots.release(1)
    moved = slots.choose(asked, 1300, cached_tokens=1220)
    assert (moved.slot, moved.pin) == (1, True), "slot 1 keeps 20 of 900: the server restores"
    assert moved.reused == 820, "what the table saw the server save: slot 0's prompt, idle when slot 1 started"
    assert slots.choose(asked, 1300, cached_tokens=820).reused == 820, "the cache holds no more than slot 0"
    far = [SYS, d("a"), d("q"), d("r"), d("s")]  # shares 420 of 1,300: slot 0 would keep less than half
    assert slots.choose(far, 1800, cached_tokens=1220) == SlotChoice(0, True, 420)


# --- what the server truncates without saving ----------------------------------------------------------------


def test_a_slot_reused_as_it_is_loses_its_unsaved_suffix_and_the_tree_forgets_it() -> None:
    """llama.cpp reuses a slot that keeps at least half of its prompt as it is and truncates the rest without
    saving it: a branch only that slot held is gone, and the tree must not count on it."""
    slots, tree = table(prompt_cache=True), KnowledgeTree(100_000)
    first = [SYS, d("a"), d("b"), d("c")]
    tree.insert(first)
    assert slots.assign(1, first, 1300) is None
    slots.release(1)
    then = [SYS, d("a"), d("b"), d("x")]  # keeps 820 of 1,300: the server reuses slot 1 as it is
    tree.insert(then)
    lost = slots.assign(1, then, 1300)
    assert lost is not None and (lost.path, lost.kept_tokens) == (tuple(first), 820)
    tree.forget(lost.path, lost.kept_tokens)
    assert tree.match(first).tokens == 820 and tree.match(then).tokens == 1220


def test_a_suffix_saved_or_held_elsewhere_is_not_lost() -> None:
    slots = table(prompt_cache=True)
    first = [SYS, d("a"), d("b"), d("c")]
    slots.assign(1, first, 1300)
    slots.release(1)
    slots.assign(0, [SYS, d("q"), d("r")], 900)  # starts while slot 1 is idle: the server saves slot 1's prompt
    slots.release(0)
    assert slots.assign(1, [SYS, d("a"), d("b"), d("x")], 1300) is None, "slot 1's prompt is in the host cache"
    slots.release(1)
    other = table(prompt_cache=True)
    other.assign(0, first, 1300)  # both slots hold the same documents, slot 0 still busy
    other.assign(1, [*first, d("e")], 1700)
    other.release(1)
    assert other.assign(1, [SYS, d("a"), d("x")], 900) is None, "slot 0 still holds what slot 1 truncates"


def test_a_restored_prompt_leaves_the_host_cache_and_its_suffix_is_lost() -> None:
    """The server moves the stored prompt it restores into the slot (``server_prompt_cache::load`` erases it);
    what lies beyond the prefix the new prompt shares is then truncated."""
    slots = table(prompt_cache=True)
    stored = [SYS, d("a"), d("b"), d("c")]
    slots.assign(1, stored, 1300)
    slots.release(1)
    slots.assign(0, [SYS, d("q")], 500)  # slot 1 idle: saved
    slots.release(0)
    slots.assign(1, [SYS, d("y"), d("z")], 900)  # keeps 20 of 1,300: saved again (already), nothing restored
    slots.release(1)
    assert slots.assign(1, [SYS, d("a"), d("b"), d("x")], 1300) == Lost(tuple(stored), 820)
    slots.release(1)
    assert slots.assign(0, [SYS, d("a"), d("b"), d("c"), d("e")], 1700) is None, "nothing left to lose"


def test_the_tables_account_of_the_host_cache_keeps_within_its_budget_dropping_the_oldest() -> None:
    """Like the server's prompt cache (``--cache-ram``), the table's account holds at most ``cache_tokens``: a
    proxy that runs for months follows every save without growing, and an old prompt dropped there is not
    counted on for a restore."""
    slots = SlotTable(2, cache_tokens=3000, clock=itertools.count().__next__)
    first = [SYS, d("a"), d("b"), d("c")]
    for n in range(50):
        slots.assign(n % 2, [SYS, d(f"x{n}"), d(f"y{n}"), d(f"z{n}")] if n else first, 1300)
        slots.release(n % 2)
    assert 0 < slots.held_tokens <= 3000
    assert slots.reused(0, [SYS, d("a"), d("b"), d("q")], 1300) == 20, "the first prompt left the cache long ago"
