"""OpenAI Responses API wire format for the FakeLLM test double (pure functions, no I/O): the response object and
the typed event sequence of a streamed response, as the API sends them.

Written from the API reference (not from the proxy's replay code, which it exists to check). What the fake answers:

- a ``reasoning`` item first when the request asks for a reasoning ``summary``;
- a ``function_call`` item when function tools are offered, the input does not end with a function call's
  output, and ``tool_choice`` is ``"required"``, names a function, or is ``"auto"`` and the last user text
  mentions a tool's name (arguments: the user's words as JSON);
- otherwise a ``message`` with one ``output_text`` part: ``answer(prompt)``, cut to ``max_output_tokens`` words
  (then ``status: "incomplete"``).

Stored responses (``store`` defaults to true, as in the API): :class:`StoredResponse` keeps the object, the turns
that ``previous_response_id`` continues and the input items with the ids the API gives them
(:func:`input_items`), listed a page at a time by :func:`item_page` (``order`` ``desc`` by default, ``limit`` 20,
``after``/``before`` cursors). Errors in the API's shape: an unknown id is a 404 ``Response with id '<id>' not
found.`` (:func:`unknown_response`), an unknown ``previous_response_id`` a 400 ``previous_response_not_found``
(:func:`unknown_previous`); cancelling a response not made in background mode is a 400 (this double's wording).

Streamed: ``response.created``, ``response.in_progress``, then per item ``response.output_item.added`` … its
content events … ``response.output_item.done``, then ``response.completed`` (or ``response.incomplete``), each
``event: <type>`` with a ``data:`` object carrying ``type`` and ``sequence_number``; text deltas one word each, with
``logprobs: []`` and an ``obfuscation`` padding string unless ``stream_options.include_obfuscation`` is false.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from upstream_doubles import openai_shapes as shapes

Event = tuple[str, dict[str, Any]]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def prompt_of(body: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]] = (),
              stored_item: Callable[[str], Mapping[str, Any] | None] = lambda _: None) -> str:
    """The request flattened to ``role: text`` lines: earlier turns (``previous_response_id``), instructions,
    input messages (an ``item_reference`` read through ``stored_item``), function call outputs."""
    lines = [f"{m['role']}: {m['text']}" for m in earlier]
    if isinstance(body.get("instructions"), str):
        lines.append(f"system: {body['instructions']}")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or ():
        if item.get("type") == "item_reference":
            item = stored_item(str(item.get("id"))) or {}
        if item.get("type") == "function_call_output":
            lines.append(f"tool: {item.get('output', '')}")
        elif "role" in item:
            lines.append(f"{item['role']}: {_text(item.get('content'))}")
    return "\n".join(lines)


def last_user_text(body: Mapping[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    users = [item for item in items or () if item.get("role") == "user"]
    return _text(users[-1].get("content")) if users else ""


def _called_function(body: Mapping[str, Any]) -> str | None:
    functions = [t["name"] for t in body.get("tools") or () if t.get("type") == "function" and "name" in t]
    choice = body.get("tool_choice", "auto")
    items = body.get("input")
    answered = isinstance(items, list) and items[-1].get("type") == "function_call_output"
    if not functions or choice == "none" or answered:
        return None
    if isinstance(choice, dict) and choice.get("type") == "function":
        return str(choice.get("name"))
    if choice == "required":
        return str(functions[0])
    text = last_user_text(body)
    return next((name for name in functions if name in text), None)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def output_items(body: Mapping[str, Any], answer: Callable[[str], str], prompt: str) -> tuple[list[dict[str, Any]],
                                                                                              str | None, int]:
    """The output items, the incomplete reason (``None`` when complete) and the output tokens."""
    items: list[dict[str, Any]] = []
    tokens = 0
    summary = (body.get("reasoning") or {}).get("summary")
    if summary:
        thought = f"Thinking about {last_user_text(body)[:40]}".strip()
        items.append({"id": new_id("rs"), "type": "reasoning",
                      "summary": [{"type": "summary_text", "text": thought}]})
        tokens += shapes.count_tokens(thought)
    function = _called_function(body)
    if function is not None:
        arguments = orjson.dumps({"query": last_user_text(body)}).decode()
        items.append({"id": new_id("fc"), "type": "function_call", "status": "completed", "arguments": arguments,
                      "call_id": new_id("call"), "name": function})
        return items, None, tokens + shapes.count_tokens(arguments)
    limit = body.get("max_output_tokens")
    pieces, finish = shapes.split_answer(answer(prompt), limit if isinstance(limit, int) else None)
    incomplete = "max_output_tokens" if finish == "length" else None
    items.append({"id": new_id("msg"), "type": "message", "status": "incomplete" if incomplete else "completed",
                  "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "".join(pieces)}],
                  "role": "assistant"})
    return items, incomplete, tokens + len(pieces)


def response_object(body: Mapping[str, Any], model: str, output: list[dict[str, Any]], incomplete: str | None,
                    input_tokens: int, output_tokens: int, *, response_id: str | None = None) -> dict[str, Any]:
    """A complete ``response`` object, echoing the request's parameters as the API does."""
    text = body.get("text") or {}
    return {
        "id": response_id or new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "background": bool(body.get("background", False)),
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": None, "summary": None, **(body.get("reasoning") or {})},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format", {"type": "text"}), "verbosity": text.get("verbosity", "medium")},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def stream_events(response: dict[str, Any], *, obfuscate: bool = True) -> list[Event]:
    """The typed events that stream ``response``, numbered from 0."""
    events: list[Event] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    in_progress = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=in_progress)
    emit("response.in_progress", response=in_progress)
    for index, item in enumerate(response["output"]):
        item_id = item["id"]
        if item["type"] == "message":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            for c, part in enumerate(item["content"]):
                where = {"item_id": item_id, "output_index": index, "content_index": c}
                emit("response.content_part.added", **where,
                     part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""})
                words = part["text"].split(" ")
                for w, word in enumerate(words):
                    delta = word if w == 0 else " " + word
                    extra = {"obfuscation": secrets.token_urlsafe(6)} if obfuscate else {}
                    emit("response.output_text.delta", **where, delta=delta, logprobs=[], **extra)
                emit("response.output_text.done", **where, text=part["text"], logprobs=[])
                emit("response.content_part.done", **where, part=part)
        elif item["type"] == "function_call":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            arguments = item["arguments"]
            for start in range(0, len(arguments), 7):
                emit("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                     delta=arguments[start:start + 7])
            emit("response.function_call_arguments.done", item_id=item_id, output_index=index,
                 arguments=arguments)
        else:  # reasoning
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for s, part in enumerate(item["summary"]):
                where = {"item_id": item_id, "output_index": index, "summary_index": s}
                emit("response.reasoning_summary_part.added", **where, part={"type": "summary_text", "text": ""})
                emit("response.reasoning_summary_text.delta", **where, delta=part["text"])
                emit("response.reasoning_summary_text.done", **where, text=part["text"])
                emit("response.reasoning_summary_part.done", **where, part=part)
        emit("response.output_item.done", output_index=index, item=item)
    terminal = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    emit(terminal, response=response)
    return events


@dataclass
class StoredResponse:
    """What the upstream keeps of a stored response."""

    response: dict[str, Any]
    turns: list[dict[str, str]]
    """The conversation up to and including this response, as ``prompt_of`` reads it (what a follow-up sees)."""
    items: list[dict[str, Any]]
    """Its input items, oldest first, each with its id."""


def input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's input as the stored items the API lists: a string is one user message; each message gets a
    ``msg_`` id, ``input_text`` content parts and ``status: completed``; other items keep their own fields."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    stored: list[dict[str, Any]] = []
    for item in items or ():
        if "role" in item and item.get("type", "message") == "message":
            content = item.get("content")
            parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else list(content or ())
            stored.append({"id": item.get("id") or new_id("msg"), "type": "message", "role": item["role"],
                           "content": parts, "status": "completed"})
        else:
            stored.append({"id": item.get("id") or new_id("item"), **item})
    return stored


def item_page(items: Sequence[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any] | None:
    """One page of a response's input items (``None`` when a query parameter is invalid)."""
    order = query.get("order", "desc")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        return None
    if order not in ("asc", "desc") or not 1 <= limit <= 100:
        return None
    ordered = list(items) if order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    if "after" in query:
        start = ids.index(query["after"]) + 1 if query["after"] in ids else len(ids)
    if "before" in query:
        end = ids.index(query["before"]) if query["before"] in ids else 0
    window = ordered[start:end]
    data = window[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(window) > limit}


def queued(response: Mapping[str, Any]) -> dict[str, Any]:
    """A background response as the API first answers it: queued, no output and no usage yet."""
    return {**response, "status": "queued", "output": [], "usage": None, "background": True}


def compacted(prompt: str) -> dict[str, Any]:
    """``POST /v1/responses/compact``'s answer for a prompt: the user messages, then one compaction item."""
    users = [line.partition(": ")[2] for line in prompt.splitlines() if line.startswith("user: ")]
    output: list[dict[str, Any]] = [
        {"id": new_id("msg"), "type": "message", "role": "user", "status": "completed",
         "content": [{"type": "input_text", "text": text}]} for text in users]
    summary = " ".join(prompt.split()[:16])
    output.append({"id": new_id("cmp"), "type": "compaction", "encrypted_content": summary.encode().hex()})
    tokens = shapes.count_tokens(prompt)
    return {"id": new_id("resp"), "object": "response.compaction", "created_at": int(time.time()), "output": output,
            "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": len(summary.split()), "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": tokens + len(summary.split())}}


def unknown_response(response_id: str) -> dict[str, Any]:
    """The API's 404 body for a response id it does not know."""
    return shapes.error_body(f"Response with id '{response_id}' not found.", "invalid_request_error")


def unknown_previous(response_id: str) -> dict[str, Any]:
    """The API's 400 body for a ``previous_response_id`` it does not know."""
    return shapes.error_body(f"Previous response with id '{response_id}' not found.", "invalid_request_error",
                             "previous_response_not_found", "previous_response_id")


def encode(event: Event) -> bytes:
    kind, payload = event
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
