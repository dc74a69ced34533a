"""Streams assembled into one response and responses replayed as streams are inverse operations."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.sse import DONE, EventSplitter, assemble, event_data, iter_events, replay

text = st.text(max_size=300)


@st.composite
def chat_responses(draw: st.DrawFn) -> dict[str, Any]:
    choices = []
    for index in range(draw(st.integers(1, 3))):
        message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | text)}
        if draw(st.booleans()):
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True)),
                              "arguments": draw(text)}}
                for i in range(draw(st.integers(1, 3)))
            ]
        choices.append({"index": index, "message": message, "logprobs": None,
                        "finish_reason": draw(st.sampled_from(["stop", "length", "tool_calls"]))})
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 1700000000, "model": "m",
            "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}


@given(chat_responses(), st.booleans())
def test_replay_then_assemble_is_identity(response: dict[str, Any], include_usage: bool) -> None:
    events = replay(response, include_usage=include_usage)
    assert events[-1] == DONE
    expected = dict(response)
    if not include_usage:
        expected.pop("usage")
    for choice in expected["choices"]:
        if choice["message"]["content"] == "" and "tool_calls" not in choice["message"]:
            choice["message"]["content"] = ""
    rebuilt = assemble(b"".join(events))
    assert rebuilt is not None
    for got, want in zip(rebuilt["choices"], expected["choices"], strict=True):
        want_content = want["message"]["content"] or ""
        assert (got["message"]["content"] or "") == want_content
        assert got["message"].get("tool_calls") == want["message"].get("tool_calls")
        assert got["finish_reason"] == want["finish_reason"]
    assert rebuilt.get("usage") == expected.get("usage")


@given(st.lists(text, min_size=1, max_size=5))
def test_text_completion_round_trip(texts: list[str]) -> None:
    response = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": "stop"}
                            for i, t in enumerate(texts)]}
    rebuilt = assemble(b"".join(replay(response, include_usage=False)))
    assert rebuilt is not None
    assert [c["text"] for c in rebuilt["choices"]] == texts


def test_unfinished_or_failed_streams_are_not_assembled() -> None:
    events = replay({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                  "finish_reason": "stop"}]}, include_usage=False)
    assert assemble(b"".join(events[:-1])) is None, "no [DONE]: the stream was cut"
    error = b'data: {"error": {"message": "boom"}}\n\n'
    assert assemble(b"".join(events[:-1]) + error + DONE) is None
    assert assemble(b"data: {not json}\n\n" + DONE) is None


def test_iter_events_handles_crlf_and_comments() -> None:
    raw = b": keep-alive\r\n\r\ndata: {\"a\": 1}\r\n\r\ndata: [DONE]\r\n\r\n"
    assert [orjson.loads(e) if e != b"[DONE]" else e for e in iter_events(raw)] == [{"a": 1}, b"[DONE]"]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_events_are_parsed_as_the_sse_specification_says(end: bytes) -> None:
    """Any line ending; one leading space dropped (not more); several data lines joined by LF; other fields and
    comments skipped."""
    raw = end.join([b"event: x", b"data:  two spaces", b"data:tight", b"id: 1", b"", b": c", b"data", b"", b""])
    assert list(iter_events(raw)) == [b" two spaces\ntight", b""]


def test_the_splitter_returns_whole_events_as_received_whatever_the_cuts() -> None:
    raw = b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: tail"
    for cut in range(1, len(raw)):
        splitter = EventSplitter()
        events = splitter.feed(raw[:cut]) + splitter.feed(raw[cut:])
        assert events == [b"data: a\r\n\r\n", b"data: b\n\n", b"data: c\r\r"], cut
        assert splitter.rest() == b"data: tail"
    assert [event_data(e) for e in events] == [b"a", b"b", b"c"]


def test_fields_of_the_wrong_type_make_a_stream_unassemblable() -> None:
    """A backend sending ``text`` or ``content`` as a number (or a choice that is not an object) is not a stream
    the proxy can store; it must say so, not raise."""
    for choice in (b'{"index":0,"text":5}', b'{"index":0,"delta":{"content":3}}', b'5', b'{"index":"x"}'):
        raw = (b'data: {"object":"chat.completion.chunk","choices":[' + choice + b']}\n\n'
               b'data: {"object":"chat.completion.chunk",'
               b'"choices":[{"index":0,"text":"a","delta":{"content":"b"}}]}\n\n'
               b'data: [DONE]\n\n')
        assert assemble(raw) is None, choice
