"""Server-sent events: the one parser of the product, and the OpenAI chunk format (assembling a stream into one
response, and replaying one).

Parsing follows the SSE specification (WHATWG HTML, "Parsing an event stream"): lines end in CR LF, LF or CR; an
event ends at a blank line; a ``data`` field's value drops one leading space and several ``data`` lines of one event
are joined by LF; comments (``:``) and other fields are skipped. :func:`iter_events` reads a complete body,
:class:`EventSplitter` cuts a stream that arrives in pieces into whole events (bytes kept as received, for
relaying), :func:`event_data` reads one event.

One stored form serves both kinds of request: a streamed miss is assembled into the ``chat.completion`` (or
``text_completion``) object a non-streamed call would have returned; a hit requested with ``stream: true`` is replayed
from that object as valid SSE — role chunk, content chunks, tool-call chunks, finish chunk, a usage chunk when
``stream_options.include_usage`` asked for one, then ``data: [DONE]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
_CONTENT_PIECE = 48  # characters per replayed content chunk: small enough to look like a live stream
_LINE_END = re.compile(rb"\r\n|\r|\n")
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")  # a blank line: two line ends (a CR LF is one)


def event_data(event: bytes) -> bytes | None:
    """The data of one event (its ``data`` values joined by LF), or ``None`` when it has no ``data`` field."""
    values = []
    for line in _LINE_END.split(event):
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            values.append(b"")
    return b"\n".join(values) if values else None


def iter_events(raw: bytes) -> Iterator[bytes]:
    """The data of each event of a complete SSE body, in order (events without data skipped)."""
    for event in _EVENT_END.split(raw):
        data = event_data(event)
        if data is not None:
            yield data


def last_json_events(raw: bytes, count: int) -> list[dict[str, Any]]:
    """The last ``count`` events of an SSE body whose data is a JSON object, last first (usage and timings ride on
    the last one or two: only those are parsed)."""
    found: list[dict[str, Any]] = []
    for data in reversed(list(iter_events(raw))):
        if not data.startswith(b"{"):
            continue
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            found.append(value)
            if len(found) == count:
                break
    return found


class EventSplitter:
    """Cuts SSE bytes arriving in pieces into whole events, each with its terminating blank line, as received."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes (possibly none)."""
        pending = self._pending + chunk
        events, cut = [], 0
        for end in _EVENT_END.finditer(pending):
            if end.end() == len(pending) and pending.endswith(b"\r"):  # a CR LF may still be arriving
                break
            events.append(pending[cut : end.end()])
            cut = end.end()
        self._pending = pending[cut:]
        return events

    def rest(self) -> bytes:
        """Bytes of an event the stream never finished."""
        rest, self._pending = self._pending, b""
        return rest


def assemble(raw: bytes) -> dict[str, Any] | None:
    """The complete response a streamed body amounts to, or ``None`` if it is not a finished OpenAI stream."""
    first: dict[str, Any] | None = None
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    finished = False
    for data in iter_events(raw):
        if data == b"[DONE]":
            finished = True
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        first = first or chunk
        if chunk.get("usage"):
            usage = chunk["usage"]
        try:
            for choice in chunk.get("choices") or ():
                _merge_choice(choices.setdefault(int(choice.get("index", 0)), {}), choice)
        except (TypeError, ValueError, AttributeError):  # fields of the wrong type: not a stream we can assemble
            return None
    if first is None or not finished:
        return None
    chat = first.get("object") == "chat.completion.chunk"
    result: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if chat else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [_finish_choice(choices[i], i, chat) for i in sorted(choices)],
    }
    if first.get("system_fingerprint") is not None:
        result["system_fingerprint"] = first["system_fingerprint"]
    if usage is not None:
        result["usage"] = usage
    return result


def _merge_choice(into: dict[str, Any], choice: dict[str, Any]) -> None:
    if choice.get("finish_reason"):
        into["finish_reason"] = choice["finish_reason"]
    if "text" in choice:
        into["text"] = into.get("text", "") + (choice.get("text") or "")
    if choice.get("logprobs") is not None:
        into["logprobs"] = choice["logprobs"]
    delta = choice.get("delta") or {}
    message = into.setdefault("message", {})
    if delta.get("role"):
        message["role"] = delta["role"]
    for field in ("content", "refusal", "reasoning_content"):
        if delta.get(field) is not None:
            message[field] = message.get(field, "") + delta[field]
    for call in delta.get("tool_calls") or ():
        calls = message.setdefault("tool_calls", {})
        slot = calls.setdefault(int(call.get("index", 0)), {"function": {"arguments": ""}})
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] = function["name"]
        slot["function"]["arguments"] += function.get("arguments") or ""


def _finish_choice(state: dict[str, Any], index: int, chat: bool) -> dict[str, Any]:
    if not chat:
        return {"index": index, "text": state.get("text", ""), "logprobs": state.get("logprobs"),
                "finish_reason": state.get("finish_reason")}
    message = dict(state.get("message") or {})
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    if "tool_calls" in message:
        message["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type", "function"), "function": c["function"]}
            for _, c in sorted(message["tool_calls"].items())
        ]
    return {"index": index, "message": message, "logprobs": state.get("logprobs"),
            "finish_reason": state.get("finish_reason")}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def replay(response: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """SSE events that stream ``response`` (a chat.completion or text_completion object)."""
    chat = response.get("object") == "chat.completion"
    base = {
        "id": response.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    if response.get("system_fingerprint") is not None:
        base["system_fingerprint"] = response["system_fingerprint"]
    events: list[bytes] = []

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        payload = {**base, "choices": choices, **extra}
        if include_usage and "usage" not in extra:
            payload["usage"] = None
        return _event(payload)

    for choice in response.get("choices") or ():
        index = choice.get("index", 0)
        if not chat:
            text = choice.get("text") or ""
            for piece in _pieces(text) or [""]:
                events.append(chunk([{"index": index, "text": piece, "logprobs": None, "finish_reason": None}]))
            events.append(chunk([{"index": index, "text": "", "logprobs": None,
                                  "finish_reason": choice.get("finish_reason")}]))
            continue
        message = choice.get("message") or {}
        events.append(chunk([{"index": index, "delta": {"role": message.get("role", "assistant"), "content": ""},
                              "logprobs": None, "finish_reason": None}]))
        for field in ("reasoning_content", "content", "refusal"):
            for piece in _pieces(message.get(field) or ""):
                events.append(chunk([{"index": index, "delta": {field: piece}, "logprobs": None,
                                      "finish_reason": None}]))
        for position, call in enumerate(message.get("tool_calls") or ()):
            delta = {"tool_calls": [{"index": position, "id": call.get("id"), "type": call.get("type", "function"),
                                     "function": call.get("function")}]}
            events.append(chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]))
        events.append(chunk([{"index": index, "delta": {}, "logprobs": None,
                              "finish_reason": choice.get("finish_reason")}]))
    if include_usage:
        events.append(chunk([], usage=response.get("usage")))
    events.append(DONE)
    return events


def _pieces(text: str) -> list[str]:
    return [text[i:i + _CONTENT_PIECE] for i in range(0, len(text), _CONTENT_PIECE)]
