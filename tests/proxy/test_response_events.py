"""Responses API event streams: replaying a response and assembling the stream are inverse operations, streams
as the API sends them assemble into the response they carry, and failed or cut streams never do."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.response_events import assemble_response, replay_response
from proxy.core.sse import iter_events
from upstream_doubles import openai_responses as wire
from upstream_doubles.openai_shapes import default_answer

text = st.text(max_size=200)


@st.composite
def items(draw: st.DrawFn, index: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["message", "function_call", "reasoning", "web_search_call"]))
    if kind == "message":
        parts = [draw(st.sampled_from([
            {"type": "output_text", "annotations": [], "logprobs": [], "text": draw(text)},
            {"type": "refusal", "refusal": draw(text)},
            {"type": "output_text", "annotations": [{"type": "url_citation", "url": "https://x", "title": "x",
                                                     "start_index": 0, "end_index": 1}],
             "logprobs": [], "text": draw(text)},
        ])) for _ in range(draw(st.integers(1, 2)))]
        return {"id": f"msg_{index}", "type": "message", "status": "completed", "role": "assistant",
                "content": parts}
    if kind == "function_call":
        return {"id": f"fc_{index}", "type": "function_call", "status": "completed", "call_id": f"call_{index}",
                "name": "lookup", "arguments": draw(text)}
    if kind == "reasoning":
        return {"id": f"rs_{index}", "type": "reasoning",
                "summary": [{"type": "summary_text", "text": draw(text)} for _ in range(draw(st.integers(0, 2)))]}
    return {"id": f"ws_{index}", "type": "web_search_call", "status": "completed",
            "action": {"type": "search", "query": draw(text)}}


@st.composite
def responses(draw: st.DrawFn) -> dict[str, Any]:
    output = [draw(items(i)) for i in range(draw(st.integers(0, 3)))]
    status = draw(st.sampled_from(["completed", "incomplete"]))
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": "m", "output": output, "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            "timings": {"predicted_n": 4}}


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(data) for data in iter_events(b"".join(raw))]


@given(responses())
def test_replay_then_assemble_is_identity(response: dict[str, Any]) -> None:
    replayed = replay_response(response)
    assert assemble_response(b"".join(replayed)) == response
    events = _events(replayed)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(chunk.startswith(b"event: " + e["type"].encode() + b"\ndata: ") for chunk, e in zip(replayed, events,
                                                                                                  strict=True))
    assert events[0]["type"] == "response.created" and events[0]["response"]["output"] == []
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["usage"] is None
    assert events[-1]["type"] == ("response.incomplete" if response["status"] == "incomplete"
                                  else "response.completed")


@given(responses())
def test_deltas_add_up_to_what_each_item_holds(response: dict[str, Any]) -> None:
    events = _events(replay_response(response))
    texts: dict[tuple[int, int], str] = {}
    arguments: dict[int, str] = {}
    for event in events:
        if event["type"] in ("response.output_text.delta", "response.refusal.delta"):
            key = (event["output_index"], event["content_index"])
            texts[key] = texts.get(key, "") + event["delta"]
        elif event["type"] == "response.function_call_arguments.delta":
            arguments[event["output_index"]] = arguments.get(event["output_index"], "") + event["delta"]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            for position, part in enumerate(item["content"]):
                assert texts.get((index, position), "") == part.get("text", part.get("refusal"))
        elif item["type"] == "function_call":
            assert arguments.get(index, "") == item["arguments"]


def _sent(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    prompt = wire.prompt_of(body)
    output, incomplete, tokens = wire.output_items(body, default_answer, prompt)
    response = wire.response_object(body, "m", output, incomplete, 5, tokens)
    return response, b"".join(wire.encode(event) for event in wire.stream_events(response))


def test_the_api_s_own_streams_assemble_into_the_response_they_carry() -> None:
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    for body in ({"input": "hello there"}, {"input": "call lookup", "tools": [tool]},
                 {"input": "think", "reasoning": {"summary": "auto"}}, {"input": "a b c d", "max_output_tokens": 2}):
        response, raw = _sent(body)
        assert assemble_response(raw) == response


def test_output_left_out_of_the_terminal_event_is_rebuilt_from_the_items() -> None:
    response, raw = _sent({"input": "hello there"})
    events = list(iter_events(raw))
    terminal = orjson.loads(events[-1])
    terminal["response"]["output"] = []
    rebuilt = b"".join(b"data: " + e + b"\n\n" for e in events[:-1]) + b"data: " + orjson.dumps(terminal) + b"\n\n"
    assert assemble_response(rebuilt) == response


def test_failed_cut_or_broken_streams_are_not_assembled() -> None:
    response, raw = _sent({"input": "hello there"})
    events = list(iter_events(raw))
    cut = b"".join(b"data: " + e + b"\n\n" for e in events[:-1])
    assert assemble_response(cut) is None, "no terminal event: the stream was cut"
    failed = {"type": "response.failed", "sequence_number": 9, "response": {**response, "status": "failed"}}
    assert assemble_response(cut + b"data: " + orjson.dumps(failed) + b"\n\n") is None
    error = {"type": "error", "sequence_number": 9, "code": "server_error", "message": "boom", "param": None}
    assert assemble_response(cut + b"data: " + orjson.dumps(error) + b"\n\n" + raw) is None
    assert assemble_response(b'data: {"error": {"message": "upstream reset"}}\n\n' + raw) is None
    assert assemble_response(b"data: {not json}\n\n" + raw) is None
