"""A real proxy in front of an upstream that closes idle keep-alive connections (IdleClosingLLM, the behaviour of
llama-server's cpp-httplib and of uvicorn, at a 0.2 s idle limit instead of 5 s): requests spaced just under and just
over the limit, plain and streamed, get no 502 the direct path would not have."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.idle_closing_llm import IdleClosingLLM

PAUSES_S = (0.05, 0.15, 0.19, 0.21, 0.25, 0.35)
"""Around the double's 0.2 s idle limit: the pool's own expiry (4 s) lets every one reuse the connection."""


async def spaced_requests(client: openai.AsyncOpenAI, rounds: int) -> list[str]:
    """One plain and one streamed request after each pause; the failures, as ``status code`` strings."""
    failures: list[str] = []
    for turn in range(rounds):
        for pause in PAUSES_S:
            await asyncio.sleep(pause)
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"question {turn} after {pause}"}]
            try:
                if turn % 2:
                    stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
                    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
                else:
                    answer = await client.chat.completions.create(model="m", messages=messages)
                    text = answer.choices[0].message.content or ""
                assert text.startswith("answer ")
            except openai.APIStatusError as error:
                failures.append(f"{error.status_code} {error.code}")
    return failures


@pytest.mark.parametrize("crossing", [True, False], ids=["close-crosses-request", "close-on-timer"])
async def test_idle_closes_by_the_upstream_give_no_502(crossing: bool) -> None:
    """Three clients at once, each spacing its requests around the limit: several pooled connections go idle and
    are closed while others are in use."""
    with IdleClosingLLM(idle_s=0.2, crossing=crossing) as llm:
        overrides: dict[str, Any] = {"cache.enabled": False, "upstreams.health_interval_s": 60.0}
        settings = proxy_settings(llm.url, **overrides)
        with ProxyServer(settings) as proxy:
            clients = [openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0) for _ in range(3)]
            failures = [
                f for found in await asyncio.gather(*(spaced_requests(c, rounds=4) for c in clients)) for f in found
            ]
            for client in clients:
                await client.close()
    assert failures == []
    assert llm.answered >= 3 * 4 * len(PAUSES_S)
    if crossing:  # the race happened, at least once per client (the test can fail); how often depends on the load
        assert llm.crossed >= 3
    else:
        assert llm.idle_closed >= 4 * sum(p > 0.2 for p in PAUSES_S) - 1
