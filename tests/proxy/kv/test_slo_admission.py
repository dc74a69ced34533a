"""TTFT objective end to end: start deadlines in the waiting queue, SLO-headroom affinity in the router, the tree
taking back the path of a request that was refused after routing, and the Route stage's 429 for it."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from normalizer.prompt_plan import Segment
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue, CacheAwareOrder, DeadlineExceeded
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Candidate, RouteDecision, Router
from proxy.kv.stages import SLO_AFTER_WAIT, Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree, Match
from proxy.server.request import Request
from tests.proxy.kv.clocks import Clock, models

# --- the pure order ----------------------------------------------------------------------------------------


def test_an_entry_past_its_deadline_is_passed_over_into_expired() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder(starvation_window_s=100)
    order.push("late", 900, 100, now=0, deadline=1.0)
    order.push("open", 0, 1000, now=0)
    order.push("in-time", 500, 500, now=0, deadline=5.0)
    assert order.pop(2.0) == "in-time"
    assert order.expired == ["late"]
    assert order.pop(2.0) == "open" and order.pop(2.0) is None and len(order) == 0


def test_a_starved_entry_past_its_deadline_is_dropped_not_started() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder(starvation_window_s=1)
    order.push("starved", 0, 1000, now=0, deadline=1.5)
    order.push("hot", 900, 100, now=1.8)
    assert order.pop(2.0) == "hot"
    assert order.expired == ["starved"]


def test_an_entry_that_the_replicas_backlog_would_start_too_late_is_dropped() -> None:
    order: CacheAwareOrder[str] = CacheAwareOrder(starvation_window_s=100)
    order.push("tight", 900, 100, now=0, deadline=2.5)
    order.push("loose", 500, 500, now=0, deadline=4.0)
    # a slot is free at 2.0, but the replica still has 1 s of another request's prefill in hand
    assert order.pop(2.0, backlog_s=1.0) == "loose"
    assert order.expired == ["tight"]


# --- the asyncio adapter -----------------------------------------------------------------------------------


async def test_at_release_the_waiter_is_checked_against_the_replicas_backlog() -> None:
    clock = Clock()
    backlog = {"s": 0.0}
    queue = AdmissionQueue(limit=1, starvation_window_s=100, clock=clock, backlog=lambda now: backlog["s"])
    await queue.acquire(0, 1)
    waiter = asyncio.create_task(queue.acquire(0, 1000, deadline=1.5))
    await asyncio.sleep(0)
    clock.t, backlog["s"] = 1.0, 0.8  # before its deadline, but the prefill in hand would end after it
    queue.release()
    with pytest.raises(DeadlineExceeded):
        await waiter
    assert queue.active == 0 and queue.waiting == 0


async def test_a_waiter_passed_over_at_release_gets_deadline_exceeded_and_holds_no_slot() -> None:
    clock = Clock()
    queue = AdmissionQueue(limit=1, starvation_window_s=100, clock=clock)
    await queue.acquire(0, 1)
    late = asyncio.create_task(queue.acquire(0, 1000, deadline=1.0))
    ok = asyncio.create_task(queue.acquire(0, 1000))
    await asyncio.sleep(0)
    assert queue.waiting == 2
    clock.t = 2.0  # the first slot frees after the late waiter's deadline
    queue.release()
    with pytest.raises(DeadlineExceeded):
        await late
    await ok  # the slot went to the waiter without a deadline
    assert queue.active == 1 and queue.waiting == 0
    queue.release()
    assert queue.active == 0


async def test_a_waiter_times_out_at_its_deadline_with_deadline_exceeded() -> None:
    loop = asyncio.get_running_loop()
    queue = AdmissionQueue(limit=1, max_wait_s=30, clock=loop.time)
    async with queue.slot(0, 1):
        with pytest.raises(DeadlineExceeded):
            await queue.acquire(0, 1, deadline=loop.time() + 0.02)
        assert queue.waiting == 0
        with pytest.raises(DeadlineExceeded):
            await queue.acquire(0, 1, deadline=loop.time() - 1)  # already past: refused at once
    assert queue.active == 0


async def test_max_wait_shorter_than_the_deadline_is_a_plain_timeout() -> None:
    loop = asyncio.get_running_loop()
    queue = AdmissionQueue(limit=1, max_wait_s=0.01, clock=loop.time)
    async with queue.slot(0, 1):
        with pytest.raises(TimeoutError) as error:
            await queue.acquire(0, 1, deadline=loop.time() + 10)
        assert not isinstance(error.value, DeadlineExceeded)
    assert queue.active == 0


# --- the router --------------------------------------------------------------------------------------------


def busy(router: Router, replica: int, prefill_s: float, name: str) -> None:
    """Put ``prefill_s`` seconds of queued prefill on ``replica``."""
    decision = RouteDecision(replica, prefill_s, 0, int(prefill_s * 1000), prefill_s, "ttft")
    router.admitted(name, decision)


def test_with_an_slo_the_most_cached_replica_within_the_headroom_wins_over_a_sooner_one() -> None:
    clock = Clock()
    router = Router(models(2), ttft_slo_s=2.0, affinity_headroom=0.7, clock=clock)
    busy(router, 0, 0.6, "queued")
    # replica 0: 0.6 s queue + 0.2 s prefill = 0.8 s; replica 1: idle, 1.0 s prefill
    decision = router.choose([Candidate(0, 800, 1000), Candidate(1, 0, 1000)])
    assert isinstance(decision, RouteDecision)
    assert decision.replica == 0 and decision.reason == "affinity"
    assert decision.prefill_s == pytest.approx(0.2)
    assert decision.start_deadline == pytest.approx(2.0 - 0.2)
    busy(router, 0, 0.8, "more")  # now 1.4 s queued: 1.6 s > 0.7 * 2 s, no longer comfortable
    decision = router.choose([Candidate(0, 800, 1000), Candidate(1, 0, 1000)])
    assert isinstance(decision, RouteDecision) and decision.replica == 1 and decision.reason == "ttft"


def test_without_an_slo_the_lowest_estimate_decides_and_there_is_no_deadline() -> None:
    router = Router(models(2), ttft_slo_s=None, clock=Clock())
    busy(router, 0, 0.6, "queued")
    decision = router.choose([Candidate(0, 800, 1000), Candidate(1, 500, 1000)])
    assert isinstance(decision, RouteDecision)
    assert decision.replica == 1 and decision.reason == "ttft" and decision.start_deadline is None


# --- the tree ----------------------------------------------------------------------------------------------


def test_retract_takes_back_an_insert_that_was_never_sent() -> None:
    tree = KnowledgeTree(100_000, clock=Clock())
    sys, a, b, c = Segment("p:s", 100), Segment("a", 500), Segment("b", 500), Segment("c", 500)
    tree.insert([sys, a, b])
    size, nodes = tree.size_tokens, tree.node_count
    predicted = tree.insert([sys, a, c])
    assert predicted == Match(2, 600)
    tree.retract([sys, a, c], predicted)
    assert (tree.size_tokens, tree.node_count) == (size, nodes)
    assert tree.match([sys, a, c]) == Match(2, 600)
    assert tree.frequency(["p:s", "a"]) == 1


def test_retract_keeps_nodes_a_later_request_used() -> None:
    tree = KnowledgeTree(100_000, clock=Clock())
    sys, a = Segment("p:s", 100), Segment("a", 500)
    predicted = tree.insert([sys, a])
    tree.insert([sys, a])  # sent after the first was routed
    tree.retract([sys, a], predicted)
    assert tree.match([sys, a]) == Match(2, 600) and tree.frequency(["p:s", "a"]) == 1


# --- the Route stage ---------------------------------------------------------------------------------------


async def test_a_request_that_cannot_start_in_time_is_a_429_and_leaves_no_trace() -> None:
    model = PrefillModel(PrefillCoefficients(0.0, 0.000001, 0.0))  # estimates far below the SLO
    replica = Replica(0, LLAMACPP, KnowledgeTree(100_000, prefill=model), model,
                      AdmissionQueue(limit=1), SlotTable(1))
    router = Router([model], ttft_slo_s=0.1)
    release = asyncio.Event()

    async def backend(ctx: RequestContext) -> Reply:
        await release.wait()
        return Reply(200, body=b'{"choices": []}')

    shape = Shape([replica], default_policy=OrderPolicy.REUSE)
    pipeline = Pipeline([ReadPrompt(None), shape, Route([replica], router)], backend)

    def ctx(n: int, docs: str) -> RequestContext:
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]}
        documents = [{"id": x, "text": f"text of {x} " * 30} for x in docs]
        return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id=f"r{n}",
                              raw_body=orjson.dumps(body), body=body,
                              proxy_fields={"ragproxy": {"documents": documents}})

    first = asyncio.create_task(pipeline(ctx(1, "ab")))
    await asyncio.sleep(0.01)
    size = replica.tree.size_tokens
    with pytest.raises(ProxyError) as error:
        await pipeline(ctx(2, "cd"))  # waits behind the first for longer than its SLO allows
    assert error.value.status == 429 and error.value.code == SLO_AFTER_WAIT == "ttft_slo_queued"
    assert error.value.headers["Retry-After"] == "1"
    assert replica.tree.size_tokens == size  # its path was taken back out of the tree
    assert len(router.loads[0].outstanding) == 1 and replica.queue.waiting == 0
    release.set()
    assert (await first).status == 200
    assert router.loads[0].active == 0 and replica.queue.active == 0
