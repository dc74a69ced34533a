"""The kv benchmarks' end-to-end side against a real ``ragproxy serve`` in front of llama.cpp-flavoured doubles:
requests go through the product over HTTP, streamed, and the outcome is read from the servers' own timings."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from loadtest.bench._kv_rag import rag_workload
from loadtest.bench._kv_serve import Serve, ServeFleet
from loadtest.bench._kv_sides import ProxySide, ServeSide, open_loop_client
from loadtest.bench._kv_workload import PRESENTS, Present, app_messages
from loadtest.goodput import OK, Outcome
from tests.loadtest.test_kv_rag import PROSE, QUESTIONS
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM


@pytest.mark.parametrize("present", PRESENTS)
def test_the_serve_side_streams_through_ragproxy_and_reads_the_servers_timings(present: Present) -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=6, seed=2, present=present)
    with (
        FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as a,
        FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as b,
    ):
        serve = Serve([a.url, b.url], slots=2, order="reuse")
        try:
            serve.wait_ready()

            async def run() -> tuple[list[Outcome], ServeSide]:
                async with open_loop_client() as client:
                    side = ServeSide([serve.url], work, client)
                    return [await side.send(i) for i in range(len(work.requests))], side

            outcomes, side = asyncio.run(run())
        finally:
            serve.stop()
        requests = a.log.entries + b.log.entries
    assert side.statuses == {} and all(o.status == OK and o.prompt_n > 0 for o in outcomes)
    assert sum(o.cache_n for o in outcomes) > 0  # the popular documents' prefix was reused, as the servers said
    chats = [r for r in requests if r.path.endswith("/chat/completions")]
    assert len(chats) == 6 and all(r.json()["stream"] for r in chats)


def test_the_in_process_side_recognises_pasted_passages_as_the_product_does() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=4, seed=2, present="pasted")
    with FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as llm:

        async def run() -> ProxySide:
            async with open_loop_client() as client:
                side = ProxySide([llm.url], work, client, slots=2, ctx_per_slot=8192)
                for i in range(len(work.requests)):
                    assert (await side.send(i)).status == OK
                return side

        side = asyncio.run(run())
    # every request was routed by its prefix and its five recognised documents, not as one prompt without any
    assert len(side.routed) == 4 and all(len(r.path) == 1 + 5 for r in side.routed)


def test_documents_joined_by_blank_lines_are_reordered_by_ragproxy_serve_once_they_moved() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=16, seed=2, present="joined")
    with FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as llm:
        serve = Serve([llm.url], slots=2, order="reuse")
        try:
            serve.wait_ready()

            async def run() -> list[Outcome]:
                async with open_loop_client() as client:
                    side = ServeSide([serve.url], work, client)
                    return [await side.send(i) for i in range(len(work.requests))]

            outcomes = asyncio.run(run())
        finally:
            serve.stop()
        sent = [r.json()["messages"][-1]["content"] for r in llm.log.entries if r.path.endswith("/chat/completions")]
    assert all(o.status == OK for o in outcomes) and len(sent) == len(work.requests)
    written = [app_messages(work, i)[-1]["content"] for i in range(len(work.requests))]
    assert sent[0] == written[0]  # nothing known yet: forwarded as the app wrote it
    # later, the chunks that moved are documents: put in the order that reuses the cache, the rank stated after them
    reordered = [i for i, (s, w) in enumerate(zip(sent, written, strict=True)) if s != w]
    assert reordered and all("Relevance order of the passages above" in sent[i] for i in reordered)
    for i in reordered:  # the same paragraphs, whole, once the line is taken out
        hint = re.search(r"\nRelevance order of the passages above[^\n]*", sent[i])
        assert hint is not None
        unhinted = sent[i][: hint.start()] + sent[i][hint.end() :]
        assert sorted(unhinted.split("\n\n")) == sorted(written[i].split("\n\n"))


def _answered(admin_url: str) -> int:
    """Data-plane requests a proxy answered, from its own metrics."""
    text = httpx.get(admin_url + "/metrics", timeout=5).text
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == "ragproxy_requests_total"))


def _limits(admin_url: str) -> list[int]:
    """The requests a proxy lets in flight on each replica at most, from ``/admin/backends``."""
    report = httpx.get(admin_url + "/admin/backends", timeout=5).json()
    return [replica["in_flight_limit"] for replica in report["knowledge_tree"]["summary"]]


def test_the_fleet_side_deals_requests_round_robin_over_proxies_that_share_one_redis() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=6, seed=2, present="structured")
    with (
        FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as a,
        FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as b,
    ):
        expected = [f"{a.url},kind=llamacpp,slots=2", f"{b.url},kind=llamacpp,slots=2"]
        fleet = ServeFleet([a.url, b.url], count=2, slots=2, order="reuse")
        try:
            fleet.wait_ready()
            redis = Redis.from_url(fleet.redis_url)
            deadline = time.monotonic() + 10  # both proxies on the bus, then two of its heartbeats (0.5 s) for each
            while redis.zcard("ragproxy:{bus}:members") < 2 and time.monotonic() < deadline:  # to count the other
                time.sleep(0.1)
            redis.close()
            time.sleep(1.0)

            async def run() -> list[Outcome]:
                async with open_loop_client() as client:
                    side = ServeSide(fleet.urls, work, client)
                    return [await side.send(i) for i in range(len(work.requests))]

            outcomes = asyncio.run(run())
            answered = [_answered(proxy.admin_url) for proxy in fleet.proxies]
            limits = [_limits(proxy.admin_url) for proxy in fleet.proxies]
            redis = Redis.from_url(fleet.redis_url)
            members = redis.zcard("ragproxy:{bus}:members")
            deadline = time.monotonic() + 10  # the prefix board publishes every second
            while not (boards := redis.keys("ragproxy:kv:*:prefixes")) and time.monotonic() < deadline:
                time.sleep(0.2)
            redis.close()
        finally:
            fleet.stop()
    assert all(o.status == OK for o in outcomes)
    assert answered == [3, 3]  # dealt in turn: requests 0, 2, 4 to the first proxy, 1, 3, 5 to the second
    assert limits == [[1, 1], [1, 1]]  # each proxy admits its share of each replica's 2 slots: one
    assert members == 2  # both proxies joined the one Redis's bus: shared mode, not two embedded proxies
    assert boards  # and published the prefixes they sent to the replicas, which the other one reads
    for proxy in fleet.proxies:
        assert f"redis.url={fleet.redis_url}" in proxy.command
        upstreams = [proxy.command[i + 1] for i, arg in enumerate(proxy.command) if arg == "--llm-upstream"]
        assert upstreams == expected  # the same replicas, in the same order: the same backend labels on the board


def test_a_fleet_needs_a_proxy() -> None:
    with pytest.raises(ValueError, match="at least one proxy"):
        ServeFleet(["http://127.0.0.1:1"], count=0, slots=2, order="reuse")
