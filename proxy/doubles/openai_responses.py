"""OpenAI Responses API wire format for the FakeLLM test double (pure functions, no I/O): the response object and
the typed event sequence of a streamed response, as the API sends them.

Written from the API reference (not from the proxy's replay code, which it exists to check). What the fake answers:

- a ``reasoning`` item first when the request asks for a reasoning ``summary``;
- a ``function_call`` item when function tools are offered, the input does not end with a function call's
  output, and ``tool_choice`` is ``"required"``, names a function, or is ``"auto"`` and the last user text
  mentions a tool's name (arguments: the user's words as JSON);
- otherwise a ``message`` with one ``output_text`` part: ``answer(prompt)``, cut to ``max_output_tokens`` words
  (then ``status: "incomplete"``).

Streamed: ``response.created``, ``response.in_progress``, then per item ``response.output_item.added`` … its
content events … ``response.output_item.done``, then ``response.completed`` (or ``response.incomplete``), each
``event: <type>`` with a ``data:`` object carrying ``type`` and ``sequence_number``; text deltas one word each, with
``logprobs: []`` and an ``obfuscation`` padding string unless ``stream_options.include_obfuscation`` is false.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.doubles import openai_shapes as shapes

Event = tuple[str, dict[str, Any]]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def prompt_of(body: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]] = ()) -> str:
    """The request flattened to ``role: text`` lines: earlier turns (``previous_response_id``), instructions,
    input messages, function call outputs."""
    lines = [f"{m['role']}: {m['text']}" for m in earlier]
    if isinstance(body.get("instructions"), str):
        lines.append(f"system: {body['instructions']}")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or ():
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


def encode(event: Event) -> bytes:
    kind, payload = event
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
