"""Reading usage from replies and streams (OpenAI and llama.cpp shapes); the usage meter of streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import last_json_events
from proxy.core.usage import Usage, client_asked_for_usage, usage_from_body, usage_from_json
from proxy.credits.streaming import UsageMeter, generated_chars


def test_openai_usage_with_cached_tokens() -> None:
    reply = {
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "total_tokens": 120,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    }
    assert usage_from_json(reply) == Usage(100, 20, 64)


def test_llama_cpp_timings_fill_what_usage_leaves_out() -> None:
    reply = {
        "usage": {"prompt_tokens": 100, "completion_tokens": 20},
        "timings": {"prompt_n": 36, "cache_n": 64, "predicted_n": 20},
    }
    assert usage_from_json(reply) == Usage(100, 20, 64)
    only_timings = {"timings": {"prompt_n": 36, "cache_n": 64, "predicted_n": 7}}
    assert usage_from_json(only_timings) == Usage(100, 7, 64)


def test_no_usage_and_nonsense() -> None:
    assert usage_from_json({"choices": []}) is None
    assert usage_from_json({"usage": None}) is None
    assert usage_from_json({"usage": {"prompt_tokens": -3, "completion_tokens": "x"}}) is None
    assert usage_from_body(b"not json") is None
    assert usage_from_body(b"[1, 2]") is None
    assert usage_from_json({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}}) == Usage(
        5, 0, 5
    )


def sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, bytes) else orjson.dumps(p)) + b"\n\n" for p in payloads)


CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE_CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}},
}
STREAM = sse(CHUNK, CHUNK, USAGE_CHUNK, b"[DONE]")


def test_client_asked_for_usage() -> None:
    assert client_asked_for_usage({"stream_options": {"include_usage": True}})
    assert not client_asked_for_usage({"stream_options": {"include_usage": False}})
    assert not client_asked_for_usage({"stream": True})
    assert not client_asked_for_usage(None)


async def replay(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(points)]


@settings(max_examples=60)
@given(st.lists(st.integers(0, 10_000), max_size=12))
async def test_the_meter_reads_usage_and_passes_every_byte(cuts: list[int]) -> None:
    meter = UsageMeter()
    seen = b"".join([piece async for piece in meter.filter(replay(split(STREAM, cuts)))])
    assert meter.usage == Usage(9, 2, 4)
    assert seen == STREAM
    assert meter.completion_events == 2 and meter.completion_chars == 4


async def test_the_meter_passes_a_stream_without_usage_untouched_and_a_partial_tail() -> None:
    meter = UsageMeter()
    data = sse(CHUNK) + b'data: {"partial'
    assert b"".join([p async for p in meter.filter(replay([data]))]) == data
    assert meter.usage is None


async def test_a_final_chunk_with_choices_and_usage_is_read() -> None:
    final = {**CHUNK, "usage": USAGE_CHUNK["usage"]}
    meter = UsageMeter()
    data = sse(CHUNK, final, b"[DONE]")
    assert b"".join([p async for p in meter.filter(replay([data]))]) == data
    assert meter.usage == Usage(9, 2, 4)


def test_responses_api_usage_in_the_object_and_in_its_terminal_event() -> None:
    response = {"object": "response", "status": "completed", "usage": {
        "input_tokens": 30, "input_tokens_details": {"cached_tokens": 12}, "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 37}}
    assert usage_from_json(response) == Usage(30, 7, 12)
    for terminal in ("response.completed", "response.incomplete"):
        assert usage_from_json({"type": terminal, "sequence_number": 9, "response": response}) == Usage(30, 7, 12)
    assert usage_from_json({"type": "response.created", "response": {**response, "usage": None}}) is None
    events = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in (
        {"type": "response.created", "sequence_number": 0, "response": {**response, "usage": None}},
        {"type": "response.completed", "sequence_number": 1, "response": response}))
    assert usage_from_json(last_json_events(events, 1)[0]) == Usage(30, 7, 12)


async def test_the_meter_reads_a_responses_event() -> None:
    completed = {"type": "response.completed", "sequence_number": 1, "response": {"usage": {
        "input_tokens": 3, "output_tokens": 1}}}
    raw = b"event: response.completed\ndata: " + orjson.dumps(completed) + b"\n\n"

    async def source() -> AsyncIterator[bytes]:
        yield raw

    meter = UsageMeter()
    assert b"".join([chunk async for chunk in meter.filter(source())]) == raw
    assert meter.usage == Usage(3, 1, 0)


@pytest.mark.parametrize(("chunk", "chars"), [
    ({"choices": [{"index": 0, "delta": {"content": "hello"}}]}, 5),
    ({"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"arguments": '{"a":'}}]}}]}, 5),
    ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, 0),
    ({"choices": [{"index": 0, "text": "legacy"}]}, 6),
    ({"type": "response.output_text.delta", "delta": "typed"}, 5),
    ({"type": "response.completed", "response": {"usage": {"output_tokens": 3}}}, 0),
    ({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}, 0),
])
def test_generated_characters_of_a_stream_chunk(chunk: dict[str, Any], chars: int) -> None:
    assert generated_chars(chunk) == chars
