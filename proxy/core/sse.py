"""Server-sent events: the one parser of the product, and chat/completions streams assembled into one response and
replayed from one.

Parsing follows the SSE specification (WHATWG HTML, "Parsing an event stream"): lines end in CR LF, LF or CR; an
event ends at a blank line; a ``data`` field's value drops one leading space and several ``data`` lines of one event
are joined by LF; comments (``:``) and other fields are skipped. :func:`iter_events` reads a complete body,
:class:`EventSplitter` cuts a stream that arrives in pieces into whole events (bytes kept as received, for
relaying), :func:`event_data` reads one event.

One stored form serves both kinds of request: a streamed miss is assembled into the ``chat.completion`` (or
``text_completion``) object a non-streamed call would have returned; a hit requested with ``stream: true`` is replayed
from that object as valid SSE — role chunk, content chunks, tool-call chunks, finish chunk, a usage chunk when
``stream_options.include_usage`` asked for one, then ``data: [DONE]``.

Fields the proxy does not know survive both ways: unknown top-level fields of the chunks (``service_tier``,
llama.cpp's ``timings``, vLLM's ``kv_transfer_params``...) and of the choices (vLLM's ``stop_reason``) are kept in
the assembled object (the last value sent wins; ``null`` only when nothing else was), unknown delta fields are kept
in the message (strings joined, as deltas, e.g. vLLM's ``reasoning``; anything else: the last value). A streamed
miss also records its :class:`StreamShape` — the first delta as the upstream sent it (``content: null`` from
llama.cpp, ``content: ""`` plus ``refusal: null`` from OpenAI) and which top-level fields rode on every chunk — and
a replay follows it; a replay of an answer that arrived complete sends ``system_fingerprint`` and ``service_tier``
on every chunk, other unknown top-level fields on the last one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
_CONTENT_PIECE = 48  # characters per replayed content chunk: small enough to look like a live stream
_LINE_END = re.compile(rb"\r\n|\r|\n")
_DONE_EVENT = re.compile(rb"(?:^|(?<=\n)|(?<=\r))data: ?\[DONE\]")
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")  # a blank line: two line ends (a CR LF is one)
_CHUNK_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage"})
_CHOICE_FIELDS = frozenset({"index", "delta", "text", "logprobs", "finish_reason", "message"})
_TEXT_FIELDS = ("content", "refusal", "reasoning_content")
_EVERY_CHUNK = ("system_fingerprint", "service_tier")
_DEFAULT_FIRST_DELTA = {"role": "assistant", "content": ""}
_REASONING = frozenset({"reasoning_content", "reasoning"})  # streamed before the answer, as upstreams do


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


def with_withheld(raw: bytes, withheld: list[bytes]) -> bytes:
    """A stream's body as the upstream sent it: ``raw`` (what the client received) with the events kept from the
    client (:attr:`proxy.core.reply.Reply.withheld`) put back before its ``[DONE]`` (at the end when it has none)."""
    if not withheld:
        return raw
    done = _DONE_EVENT.search(raw)
    cut = done.start() if done is not None else len(raw)
    return raw[:cut] + b"".join(withheld) + raw[cut:]


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


@dataclass(frozen=True, slots=True)
class StreamShape:
    """How an upstream shaped a stream, beyond what the assembled object says (stored with the entry)."""

    first_delta: dict[str, Any] = field(default_factory=lambda: dict(_DEFAULT_FIRST_DELTA))
    """The first chunk's delta without its text (a replay opens each choice with it)."""
    every_chunk: tuple[str, ...] = _EVERY_CHUNK
    """Top-level fields sent on every chunk; other unknown top-level fields go on the last one."""

    def as_meta(self) -> dict[str, Any]:
        return {"first_delta": self.first_delta, "every_chunk": list(self.every_chunk)}

    @classmethod
    def from_meta(cls, meta: Any) -> StreamShape:
        if not isinstance(meta, dict):
            return cls()
        first, every = meta.get("first_delta"), meta.get("every_chunk")
        return cls(first if isinstance(first, dict) else dict(_DEFAULT_FIRST_DELTA),
                   tuple(every) if isinstance(every, list) else _EVERY_CHUNK)


def assemble(raw: bytes) -> dict[str, Any] | None:
    """The complete response a streamed body amounts to, or ``None`` if it is not a finished OpenAI stream."""
    assembled = assemble_stream(raw)
    return None if assembled is None else assembled[0]


def assemble_stream(raw: bytes) -> tuple[dict[str, Any], StreamShape] | None:
    """The complete response a streamed body amounts to and the stream's :class:`StreamShape`, or ``None`` if it
    is not a finished OpenAI stream."""
    first: dict[str, Any] | None = None
    first_delta: dict[str, Any] | None = None
    choices: dict[int, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
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
        _keep_unknown(extra, chunk, _CHUNK_FIELDS)
        try:
            for choice in chunk.get("choices") or ():
                if first_delta is None and isinstance(choice.get("delta"), dict):
                    first_delta = {k: "" if isinstance(v, str) and k != "role" else v
                                   for k, v in choice["delta"].items() if v is None or isinstance(v, str)}
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
        **extra,
    }
    if usage is not None:
        result["usage"] = usage
    every = tuple(k for k in first if k not in _CHUNK_FIELDS)
    return result, StreamShape(first_delta or dict(_DEFAULT_FIRST_DELTA), every)


def _keep_unknown(into: dict[str, Any], source: dict[str, Any], known: frozenset[str]) -> None:
    """Copy ``source``'s unknown fields into ``into``: the last value sent wins, ``null`` only over nothing."""
    for key, value in source.items():
        if key not in known and (value is not None or key not in into):
            into[key] = value


def _merge_choice(into: dict[str, Any], choice: dict[str, Any]) -> None:
    if choice.get("finish_reason"):
        into["finish_reason"] = choice["finish_reason"]
    if "text" in choice:
        into["text"] = into.get("text", "") + (choice.get("text") or "")
    if choice.get("logprobs") is not None:
        into["logprobs"] = choice["logprobs"]
    _keep_unknown(into, choice, _CHOICE_FIELDS)
    delta = choice.get("delta") or {}
    message = into.setdefault("message", {})
    if delta.get("role"):
        message["role"] = delta["role"]
    for name, value in delta.items():
        if value is None or name in ("role", "tool_calls"):
            continue
        if name in _TEXT_FIELDS or isinstance(value, str):
            message[name] = message.get(name, "") + value
        else:
            message[name] = value
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


_CHOICE_ORDER = ("index", "message", "text", "logprobs", "finish_reason")


def _finish_choice(state: dict[str, Any], index: int, chat: bool) -> dict[str, Any]:
    rest = {k: v for k, v in state.items() if k not in _CHOICE_ORDER}
    if not chat:
        return {"index": index, "text": state.get("text", ""), "logprobs": state.get("logprobs"),
                "finish_reason": state.get("finish_reason"), **rest}
    message = dict(state.get("message") or {})
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    if "tool_calls" in message:
        message["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type", "function"), "function": c["function"]}
            for _, c in sorted(message["tool_calls"].items())
        ]
    return {"index": index, "message": message, "logprobs": state.get("logprobs"),
            "finish_reason": state.get("finish_reason"), **rest}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def replay(response: dict[str, Any], *, include_usage: bool, shape: StreamShape | None = None) -> list[bytes]:
    """SSE events that stream ``response`` (a chat.completion or text_completion object), shaped like ``shape``
    (the upstream's own stream, when it was streamed)."""
    shape = shape or StreamShape()
    chat = response.get("object") == "chat.completion"
    base = {
        "id": response.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    unknown = {k: v for k, v in response.items() if k not in _CHUNK_FIELDS}
    base.update((k, v) for k, v in unknown.items() if k in shape.every_chunk)
    last = {k: v for k, v in unknown.items() if k not in shape.every_chunk}
    events: list[bytes] = []

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        payload = {**base, "choices": choices, **extra}
        if include_usage and "usage" not in extra:
            payload["usage"] = None
        return payload

    payloads: list[dict[str, Any]] = []
    for choice in response.get("choices") or ():
        index = choice.get("index", 0)
        if not chat:
            text = choice.get("text") or ""
            for piece in text_pieces(text) or [""]:
                payloads.append(chunk([{"index": index, "text": piece, "logprobs": None, "finish_reason": None}]))
            payloads.append(chunk([_final(choice, {"index": index, "text": ""})]))
            continue
        message = choice.get("message") or {}
        opening = {**shape.first_delta, "role": message.get("role", "assistant")}
        payloads.append(chunk([{"index": index, "delta": opening, "logprobs": None, "finish_reason": None}]))
        for name, value in sorted(message.items(), key=lambda field: field[0] not in _REASONING):
            if name in ("role", "tool_calls") or value is None:
                continue
            deltas = text_pieces(value) if isinstance(value, str) else [value]
            payloads.extend(chunk([{"index": index, "delta": {name: piece}, "logprobs": None,
                                    "finish_reason": None}]) for piece in deltas)
        for position, call in enumerate(message.get("tool_calls") or ()):
            delta = {"tool_calls": [{"index": position, "id": call.get("id"), "type": call.get("type", "function"),
                                     "function": call.get("function")}]}
            payloads.append(chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]))
        payloads.append(chunk([_final(choice, {"index": index, "delta": {}})]))
    if include_usage:
        payloads.append(chunk([], usage=response.get("usage")))
    if payloads:
        payloads[-1].update(last)
    events.extend(_event(payload) for payload in payloads)
    events.append(DONE)
    return events


def _final(choice: dict[str, Any], opening: dict[str, Any]) -> dict[str, Any]:
    """The finishing chunk's choice: its finish reason and the choice's fields the proxy does not know."""
    rest = {k: v for k, v in choice.items() if k not in _CHOICE_FIELDS}
    return {**opening, "logprobs": None, "finish_reason": choice.get("finish_reason"), **rest}


def text_pieces(text: str) -> list[str]:
    """``text`` in replay-sized pieces (none for an empty text)."""
    return [text[i:i + _CONTENT_PIECE] for i in range(0, len(text), _CONTENT_PIECE)]
