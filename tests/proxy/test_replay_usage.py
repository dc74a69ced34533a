"""What a replayed answer carries is what its own request asks for, whatever the request that filled the cache
asked: the table below, driven by the official openai SDK, with credits off (nothing else asks the upstream for
usage) and on.

Each row: the API, how the first request (the miss that fills the cache) asks, how the second (the repeat) asks, and
what the repeat must be. A stream carries a usage chunk (``choices: []``, the miss's token counts) exactly when it
sets ``stream_options.include_usage``; a JSON answer always carries its usage; a Responses stream carries its usage in
``response.completed`` (the API has no option). Requests for several sampled choices (``n``) or for ``logprobs`` are
never served from the cache: their repeat goes upstream and gets the upstream's own answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from proxy.core.outcome import MICRO
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

PLAIN, STREAM, STREAM_USAGE = "json", "stream", "stream+usage"
"""How a request asks: a JSON answer; a stream without ``include_usage``; a stream with it."""


@dataclass(frozen=True)
class Row:
    api: str
    """``chat``, ``completions`` or ``responses``."""
    fill: str
    repeat: str
    extra: tuple[tuple[str, Any], ...] = ()
    """Further request fields, on both requests."""
    replayed: bool = True
    """The repeat is served from the cache (else it goes upstream)."""

    @property
    def id(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.extra)
        return f"{self.api}:{self.fill}->{self.repeat}{':' + extra if extra else ''}"


TABLE = [
    *(Row(api, fill, repeat) for api in ("chat", "completions")
      for fill in (PLAIN, STREAM, STREAM_USAGE) for repeat in (PLAIN, STREAM, STREAM_USAGE)),
    *(Row("responses", fill, repeat) for fill in (PLAIN, STREAM) for repeat in (PLAIN, STREAM)),
    Row("chat", STREAM, STREAM_USAGE, (("n", 2),), replayed=False),
    Row("chat", STREAM_USAGE, STREAM, (("n", 2),), replayed=False),
    Row("chat", STREAM, STREAM_USAGE, (("logprobs", True),), replayed=False),
    Row("completions", PLAIN, STREAM_USAGE, (("logprobs", 1),), replayed=False),
]


@dataclass
class Seen:
    """What the SDK made of one answer."""

    status: str
    texts: list[str]
    usage: tuple[int, int] | None
    """(prompt, completion) tokens, from the usage the answer carried; ``None``: it carried none."""
    usage_chunks: int = 0
    """Stream chunks with usage (each must be the one final chunk with no choices)."""
    stray: int = 0
    """Stream chunks with no choices and no usage, or with usage and choices."""


def _ask(client: openai.OpenAI, row: Row, how: str, question: str) -> Seen:
    extra = dict(row.extra)
    stream = how != PLAIN
    options = {"stream_options": {"include_usage": True}} if how == STREAM_USAGE else {}
    if row.api == "responses":
        return _ask_responses(client, stream, question)
    if row.api == "chat":
        call = client.chat.completions.with_raw_response.create
        raw = call(model="fake-model", messages=[{"role": "user", "content": question}], stream=stream,
                   max_tokens=40, **options, **extra)
    else:
        call = client.completions.with_raw_response.create  # type: ignore[assignment]
        raw = call(model="fake-model", prompt=question, stream=stream, max_tokens=40, **options, **extra)
    status = raw.headers["X-Cache-Status"]
    parsed = raw.parse()
    if not stream:
        usage = parsed.usage
        texts = [c.message.content if row.api == "chat" else c.text for c in parsed.choices]
        return Seen(status, texts, None if usage is None else (usage.prompt_tokens, usage.completion_tokens))
    texts: dict[int, str] = {}
    seen = Seen(status, [], None)
    for chunk in parsed:
        if chunk.usage is not None:
            seen.usage_chunks += 1
            seen.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            seen.stray += bool(chunk.choices)
        elif not chunk.choices:
            seen.stray += 1
        for choice in chunk.choices:
            piece = (choice.delta.content if row.api == "chat" else choice.text) or ""
            texts[choice.index] = texts.get(choice.index, "") + piece
    seen.texts = [texts[i] for i in sorted(texts)]
    return seen


def _ask_responses(client: openai.OpenAI, stream: bool, question: str) -> Seen:
    raw = client.responses.with_raw_response.create(model="fake-model", input=question, stream=stream, store=False)
    status = raw.headers["X-Cache-Status"]
    parsed = raw.parse()
    if not stream:
        usage = parsed.usage
        return Seen(status, [parsed.output_text], None if usage is None else (usage.input_tokens,
                                                                              usage.output_tokens))
    seen = Seen(status, [], None)
    for event in parsed:
        if event.type == "response.completed":
            usage = event.response.usage
            seen.texts = [event.response.output_text]
            if usage is not None:
                seen.usage_chunks += 1
                seen.usage = (usage.input_tokens, usage.output_tokens)
    return seen


@pytest.fixture(params=["credits off", "credits on"], scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    """A caching proxy (its defaults), with credits off or on, in front of a fake LLM that reports a stream's
    usage only when asked, as OpenAI's API does."""
    billed = request.param == "credits on"
    overrides: dict[str, Any] = {"data_dir": str(tmp_path_factory.mktemp("replay"))}
    if billed:
        overrides.update({"auth.mode": "keys", "credits.enabled": True, "credits.sqlite_synchronous": "NORMAL"})
    with FakeLLM() as llm, ProxyServer(proxy_settings(llm.url, **overrides)) as proxy:
        proxy.key = "unused"  # type: ignore[attr-defined]
        proxy.llm = llm  # type: ignore[attr-defined]
        if billed:
            created = proxy.call(proxy.runtime.credits.keys.create("replayer", "acme"))  # type: ignore[union-attr]
            proxy.call(proxy.runtime.credits.store.top_up("replayer", 100 * MICRO,  # type: ignore[union-attr]
                                                          tenant="acme"))
            proxy.key = created.plaintext  # type: ignore[attr-defined]
        yield proxy


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.id)
def test_a_replay_carries_what_its_own_request_asks_for(server: ProxyServer, row: Row) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.key, max_retries=0)  # type: ignore[attr-defined]
    question = f"What does a replay carry? ({row.id})"
    log = server.llm.log  # type: ignore[attr-defined]
    path = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}[row.api]
    calls = log.count(path)
    first = _ask(client, row, row.fill, question)
    second = _ask(client, row, row.repeat, question)
    for seen, how in ((first, row.fill), (second, row.repeat)):
        assert seen.stray == 0, "no chunk without choices but the usage chunk, none with both"
        if how == STREAM and row.api != "responses":
            assert seen.usage is None and seen.usage_chunks == 0, "usage left out: the request did not ask"
        else:
            assert seen.usage is not None and seen.usage_chunks == (0 if how == PLAIN else 1), \
                "usage carried: the request asked (a JSON answer and a Responses stream always do)"
    if row.replayed:
        assert first.status in ("MISS", "BYPASS") and second.status == "HIT", (first.status, second.status)
        assert second.texts == first.texts
        if first.usage is not None and second.usage is not None:
            assert second.usage == first.usage, "the replay reports the usage of the answer it replays"
    else:
        assert (first.status, second.status) == ("BYPASS", "BYPASS")
    assert log.count(path) - calls == (1 if row.replayed else 2)
