"""Streamed Responses API answers (``POST /v1/responses`` with ``stream: true``): assembling a finished event stream
into the response object, and replaying one as an event stream.

One stored form serves both kinds of request, as for chat (:mod:`proxy.core.sse`): a streamed miss is stored as the
response object its terminal event carries (``response.completed``, or ``response.incomplete`` when
``max_output_tokens`` cut it short); a hit asked for with ``stream: true`` is replayed from that object as the
typed events the API sends, each ``event: <type>`` plus a ``data:`` object with its ``type`` and a
``sequence_number`` counting from 0::

    response.created → response.in_progress →
      per output item: response.output_item.added →
        message: per content part: response.content_part.added → response.output_text.delta … (one per 48
                 characters; response.refusal.delta for a refusal) → response.output_text.annotation.added …
                 → response.output_text.done → response.content_part.done
        function_call: response.function_call_arguments.delta … → response.function_call_arguments.done
        reasoning: per summary part: response.reasoning_summary_part.added →
                   response.reasoning_summary_text.delta … → response.reasoning_summary_text.done →
                   response.reasoning_summary_part.done
        any other item (hosted tool calls…): no events of its own
      → response.output_item.done
    → response.completed (or response.incomplete)

The lifecycle events carry the response with ``status: "in_progress"``, no output and no usage; the terminal
event carries the stored object unchanged, so a client that assembles the stream (the SDKs'
``responses.stream()``) ends with the same object a non-streamed call returns. Not replayed: ``obfuscation``
(random padding the API adds to deltas against length side channels: a replay's sizes come from the stored
text, not from live generation) and per-token ``logprobs`` (requests asking for them are not cached).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.sse import iter_events, text_pieces
from proxy.core.usage import RESPONSE_TERMINAL

_CLEARED_WHILE_RUNNING = ("incomplete_details", "completed_at", "error")


def assemble_response(raw: bytes) -> dict[str, Any] | None:
    """The response object a finished event stream amounts to, or ``None`` when the stream failed, carried an
    error, or did not reach a terminal event. When the terminal event's ``output`` is empty (some servers leave
    it out), it is rebuilt from the ``response.output_item.done`` events."""
    final: dict[str, Any] | None = None
    items: dict[int, Any] = {}
    for data in iter_events(raw):
        if data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict) or "error" in event or event.get("type") in ("error", "response.failed"):
            return None
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("output_index"), int):
            items[event["output_index"]] = event.get("item")
        elif kind in RESPONSE_TERMINAL and isinstance(event.get("response"), dict):
            final = event["response"]
    if final is None:
        return None
    if not final.get("output") and items:
        final = {**final, "output": [items[index] for index in sorted(items)]}
    return final


class _Events:
    """Numbered typed events."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def add(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(self.out), **fields}
        self.out.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")


def replay_response(response: dict[str, Any]) -> list[bytes]:
    """The event stream of ``response`` (a Responses API object), as the API streams it."""
    events = _Events()
    running = {**response, "status": "in_progress", "output": [], "usage": None}
    for name in _CLEARED_WHILE_RUNNING:
        if name in running:
            running[name] = None
    events.add("response.created", response=running)
    events.add("response.in_progress", response=running)
    for index, item in enumerate(response.get("output") or ()):
        if isinstance(item, dict):
            _item(events, index, item)
    terminal = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    events.add(terminal, response=response)
    return events.out


def _item(events: _Events, index: int, item: dict[str, Any]) -> None:
    kind, item_id = item.get("type"), item.get("id")
    started = {**item, "status": "in_progress"} if "status" in item else dict(item)
    if kind == "message":
        events.add("response.output_item.added", output_index=index, item={**started, "content": []})
        for position, part in enumerate(item.get("content") or ()):
            if isinstance(part, dict):
                _part(events, index, item_id, position, part)
    elif kind == "function_call":
        arguments = str(item.get("arguments") or "")
        events.add("response.output_item.added", output_index=index, item={**started, "arguments": ""})
        for piece in text_pieces(arguments):
            events.add("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=piece)
        events.add("response.function_call_arguments.done", item_id=item_id, output_index=index,
                   arguments=arguments)
    elif kind == "reasoning":
        emptied = {**started, "summary": [], **({"content": []} if "content" in item else {})}
        events.add("response.output_item.added", output_index=index, item=emptied)
        for position, part in enumerate(item.get("summary") or ()):
            if isinstance(part, dict):
                _summary(events, index, item_id, position, part)
    else:
        events.add("response.output_item.added", output_index=index, item=started)
    events.add("response.output_item.done", output_index=index, item=item)


def _part(events: _Events, index: int, item_id: Any, position: int, part: dict[str, Any]) -> None:
    where = {"item_id": item_id, "output_index": index, "content_index": position}
    kind = part.get("type")
    if kind == "output_text":
        text = str(part.get("text") or "")
        events.add("response.content_part.added", **where, part={**part, "text": "", "annotations": []})
        for piece in text_pieces(text):
            events.add("response.output_text.delta", **where, delta=piece, logprobs=[])
        for number, annotation in enumerate(part.get("annotations") or ()):
            events.add("response.output_text.annotation.added", **where, annotation_index=number,
                       annotation=annotation)
        events.add("response.output_text.done", **where, text=text, logprobs=part.get("logprobs") or [])
    elif kind == "refusal":
        refusal = str(part.get("refusal") or "")
        events.add("response.content_part.added", **where, part={**part, "refusal": ""})
        for piece in text_pieces(refusal):
            events.add("response.refusal.delta", **where, delta=piece)
        events.add("response.refusal.done", **where, refusal=refusal)
    else:
        events.add("response.content_part.added", **where, part=part)
    events.add("response.content_part.done", **where, part=part)


def _summary(events: _Events, index: int, item_id: Any, position: int, part: dict[str, Any]) -> None:
    where = {"item_id": item_id, "output_index": index, "summary_index": position}
    text = str(part.get("text") or "")
    events.add("response.reasoning_summary_part.added", **where, part={**part, "text": ""})
    for piece in text_pieces(text):
        events.add("response.reasoning_summary_text.delta", **where, delta=piece)
    events.add("response.reasoning_summary_text.done", **where, text=text)
    events.add("response.reasoning_summary_part.done", **where, part=part)
