"""The load benchmark tells the proxy's two SLO refusals apart: at arrival and after waiting in a replica's queue,
from the 429's error code (over HTTP, plain and streamed) and from the in-process stages' error."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from loadtest.bench._kv_rag import rag_workload
from loadtest.bench._kv_requests import chat_body, post_chat
from loadtest.bench._kv_sides import ProxySide, open_loop_client
from loadtest.goodput import AFTER_WAIT, AT_ARRIVAL, OK, REJECTED, Outcome, run_figures
from proxy.core.errors import Dialect, ProxyError
from proxy.kv.stages import SLO_AFTER_WAIT, SLO_AT_ARRIVAL
from tests.loadtest.test_kv_rag import PROSE, QUESTIONS
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM


def _refusing(codes: list[str | None]) -> httpx.MockTransport:
    """A server answering each request with the next of ``codes``: the proxy's 429 with that error code, or a 429
    without a JSON body (``None``)."""
    pending = iter(codes)

    def answer(request: httpx.Request) -> httpx.Response:
        code = next(pending)
        if code is None:
            return httpx.Response(429, content=b"too many requests")
        return httpx.Response(429, content=ProxyError(429, "refused", code=code).body(Dialect.OPENAI))

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_429_is_a_refusal_at_arrival_or_after_waiting_as_its_code_says(stream: bool) -> None:
    codes = [SLO_AT_ARRIVAL, SLO_AFTER_WAIT, SLO_AFTER_WAIT, "queue_timeout", None]
    statuses: Counter[int] = Counter()
    async with httpx.AsyncClient(transport=_refusing(codes)) as client:
        body = chat_body([{"role": "user", "content": "q"}], stream=stream)
        outcomes = [await post_chat(client, "http://proxy/v1/chat/completions", body, statuses) for _ in codes]
    assert [o.status for o in outcomes] == [REJECTED] * 5 and statuses == {429: 5}
    assert [o.refused for o in outcomes] == [AT_ARRIVAL, AFTER_WAIT, AFTER_WAIT, None, None]
    figures = run_figures(1.0, 5.0, [*outcomes, Outcome(OK, 0.1)], slo_s=1.0)
    assert (figures.rejected, figures.rejected_at_arrival, figures.rejected_after_wait) == (5, 1, 2)


def test_the_in_process_side_counts_a_refusal_at_arrival() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=2, seed=2, present="structured")
    with FakeLLM(kv=KVCacheModel(), slots=2, flavor="llamacpp") as llm:

        async def run() -> list[Outcome]:
            async with open_loop_client() as client:
                side = ProxySide([llm.url], work, client, slots=2, ctx_per_slot=8192)
                side.set_objective(1e-6)  # no replica can start anything this soon
                return [await side.send(i) for i in range(len(work.requests))]

        outcomes = asyncio.run(run())
    assert [(o.status, o.refused) for o in outcomes] == [(REJECTED, AT_ARRIVAL)] * 2
