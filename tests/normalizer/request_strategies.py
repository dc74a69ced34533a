"""Hypothesis strategies for chat-completion requests and their equivalent encodings.

A *spec* is a request in its plainest spelling: defaults omitted, content as strings, integral numbers
as ints.
:func:`encodings` draws one of the many equivalent wire encodings of a spec (shuffled key order, explicit
defaults or nulls, ``1`` vs ``1.0``, string vs single text part, ``stop`` as string or list, ``max_tokens`` vs
``max_completion_tokens``, excluded fields added, whitespace and escaping of the JSON text).
:data:`MUTATIONS` change one answer-relevant aspect of a spec.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import strategies as st

Spec = dict[str, Any]
Draw = Callable[..., Any]

_texts = st.text(max_size=12)
_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_unit_floats = st.one_of(st.integers(0, 2), st.floats(0, 2, allow_nan=False, allow_infinity=False))
_penalties = st.one_of(st.integers(-2, 2), st.floats(-2, 2, allow_nan=False, allow_infinity=False))


@st.composite
def _schema(draw: Draw) -> dict[str, Any]:
    names = draw(st.lists(_names, max_size=3, unique=True))
    properties = {name: {"type": draw(st.sampled_from(["string", "integer", "number"]))} for name in names}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if names and draw(st.booleans()):
        schema["required"] = names[:1]
    return schema


@st.composite
def _tool(draw: Draw) -> dict[str, Any]:
    function: dict[str, Any] = {"name": draw(_names), "parameters": draw(_schema())}
    if draw(st.booleans()):
        function["description"] = draw(_texts)
    return {"type": "function", "function": function}


@st.composite
def _message(draw: Draw) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    message: dict[str, Any] = {"role": role, "content": draw(_texts)}
    if role == "tool":
        message["tool_call_id"] = draw(_names)
    if role == "assistant" and draw(st.booleans()):
        arguments = json.dumps({"x": draw(st.integers(0, 9))})
        message["tool_calls"] = [
            {
                "id": draw(_names),
                "type": "function",
                "function": {"name": draw(_names), "arguments": arguments},
            }
        ]
    if role == "user" and draw(st.booleans()):
        message["name"] = draw(_names)
    return message


@st.composite
def chat_specs(draw: Draw) -> Spec:
    """A chat request in its plainest spelling."""
    spec: Spec = {
        "model": draw(st.sampled_from(["gpt-4o", "llama-3.1-8b", "qwen"])),
        "messages": draw(st.lists(_message(), min_size=1, max_size=4)),
    }
    optional: dict[str, st.SearchStrategy[Any]] = {
        "temperature": _unit_floats,
        "top_p": st.floats(0.01, 1, allow_nan=False),
        "seed": st.integers(0, 2**31),
        "stop": st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=3, unique=True),
        "max_tokens": st.integers(1, 4096),
        "presence_penalty": _penalties,
        "frequency_penalty": _penalties,
        "logit_bias": st.dictionaries(
            st.integers(0, 50000).map(str), st.integers(-100, 100).filter(bool), min_size=1, max_size=3
        ),
        "tools": st.lists(_tool(), min_size=1, max_size=2),
        "response_format": st.sampled_from(
            [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}]
        ),
    }
    for field, strategy in optional.items():
        if draw(st.booleans()):
            spec[field] = draw(strategy)
    if "tools" in spec and draw(st.booleans()):
        spec["tool_choice"] = draw(st.sampled_from(["none", "required"]))
    return spec


_DEFAULTS: dict[str, Any] = {
    "temperature": 1,
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "n": 1,
    "logprobs": False,
    "response_format": {"type": "text"},
    "parallel_tool_calls": True,
}
_EXCLUDED: dict[str, st.SearchStrategy[Any]] = {
    "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}),
    "user": _names,
    "metadata": st.dictionaries(_names, _names, max_size=2),
    "store": st.booleans(),
    "cache": st.just({"ttl": 60}),
    "ragproxy": st.just({"namespace": "docs"}),
}


def _renumber(value: Any, draw: Draw) -> Any:
    """Integral numbers as int or float at random (never booleans)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) < 2**53 and draw(st.booleans()):
        return float(value)
    if isinstance(value, float) and value.is_integer() and draw(st.booleans()):
        return int(value)
    return value


def _shuffle(value: Any, draw: Draw, *, keep_order: bool = False) -> Any:
    """Key order shuffled at every level except inside a schema's ``properties``."""
    if isinstance(value, dict):
        keys = list(value) if keep_order else draw(st.permutations(list(value)))
        return {key: _shuffle(value[key], draw, keep_order=key == "properties") for key in keys}
    if isinstance(value, list):
        return [_shuffle(item, draw) for item in value]
    return _renumber(value, draw)


def _encode_message(message: dict[str, Any], draw: Draw) -> dict[str, Any]:
    message = dict(message)
    if draw(st.booleans()):
        message["content"] = [{"type": "text", "text": message["content"]}]
    if "name" not in message and draw(st.booleans()):
        message["name"] = None
    return message


@st.composite
def encodings(draw: Draw, spec: Spec) -> Spec:
    """One random wire encoding equivalent to ``spec`` (see the module docstring)."""
    body: Spec = dict(spec)
    body["messages"] = [_encode_message(message, draw) for message in spec["messages"]]
    for field, default in _DEFAULTS.items():
        if field not in body:
            choice = draw(st.sampled_from(["omit", "default", "null"]))
            if choice != "omit":
                body[field] = default if choice == "default" else None
    if "tool_choice" not in body and draw(st.booleans()):
        body["tool_choice"] = "auto" if spec.get("tools") else "none"
    if "stop" in body:
        stop = list(body["stop"])
        if len(stop) == 1 and draw(st.booleans()):
            body["stop"] = stop[0]
        else:
            body["stop"] = draw(st.permutations(stop + draw(st.lists(st.sampled_from(stop), max_size=2))))
    elif draw(st.booleans()):
        body["stop"] = draw(st.sampled_from([None, []]))
    if "max_tokens" in body:
        choice = draw(st.sampled_from(["legacy", "current", "both"]))
        if choice != "legacy":
            body["max_completion_tokens"] = body["max_tokens"]
        if choice == "current":
            del body["max_tokens"]
    if "logit_bias" in body and draw(st.booleans()):
        body["logit_bias"] = {**body["logit_bias"], "99999": 0}
    for field, strategy in _EXCLUDED.items():
        if draw(st.booleans()):
            body[field] = draw(strategy)
    body = _shuffle(body, draw)
    text = json.dumps(
        body,
        indent=draw(st.sampled_from([None, 1, 4])),
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")])),
    )
    parsed: Spec = orjson.loads(text)
    return parsed


def _effective(spec: Spec, field: str) -> Any:
    return spec.get(field, _DEFAULTS.get(field))


def _different_number(old: Any, draw: Draw, low: float, high: float) -> float:
    return float(draw(st.floats(low, high, allow_nan=False).filter(lambda new: new != old)))


def _mutate_model(spec: Spec, draw: Draw) -> None:
    spec["model"] += "-x"


def _mutate_temperature(spec: Spec, draw: Draw) -> None:
    spec["temperature"] = _different_number(_effective(spec, "temperature"), draw, 0, 2)


def _mutate_top_p(spec: Spec, draw: Draw) -> None:
    spec["top_p"] = _different_number(_effective(spec, "top_p"), draw, 0.01, 1)


def _mutate_penalty(spec: Spec, draw: Draw) -> None:
    field = draw(st.sampled_from(["presence_penalty", "frequency_penalty"]))
    spec[field] = _different_number(_effective(spec, field), draw, -2, 2)


def _mutate_seed(spec: Spec, draw: Draw) -> None:
    spec["seed"] = spec.get("seed", -1) + 1


def _mutate_stop(spec: Spec, draw: Draw) -> None:
    stop = spec.get("stop", [])
    spec["stop"] = [*stop, draw(st.text(min_size=1, max_size=4).filter(lambda s: s not in stop))]


def _mutate_max_tokens(spec: Spec, draw: Draw) -> None:
    spec["max_tokens"] = spec.get("max_tokens", 0) + draw(st.integers(1, 100))


def _mutate_n(spec: Spec, draw: Draw) -> None:
    spec["n"] = draw(st.integers(2, 5))


def _mutate_logit_bias(spec: Spec, draw: Draw) -> None:
    bias = dict(spec.get("logit_bias", {}))
    token = draw(st.integers(0, 50000).map(str).filter(lambda t: t not in bias))
    bias[token] = draw(st.integers(-100, 100).filter(bool))
    spec["logit_bias"] = bias


def _mutate_content(spec: Spec, draw: Draw) -> None:
    index = draw(st.integers(0, len(spec["messages"]) - 1))
    message = dict(spec["messages"][index])
    message["content"] += draw(st.text(min_size=1, max_size=3))
    spec["messages"][index] = message


def _mutate_role(spec: Spec, draw: Draw) -> None:
    index = draw(st.integers(0, len(spec["messages"]) - 1))
    message = dict(spec["messages"][index])
    message["role"] = draw(
        st.sampled_from(["system", "user", "assistant"]).filter(lambda r: r != message["role"])
    )
    spec["messages"][index] = message


def _mutate_message_count(spec: Spec, draw: Draw) -> None:
    if len(spec["messages"]) > 1 and draw(st.booleans()):
        spec["messages"].pop()
    else:
        spec["messages"].append({"role": "user", "content": draw(_texts)})


def _mutate_name(spec: Spec, draw: Draw) -> None:
    index = draw(st.integers(0, len(spec["messages"]) - 1))
    message = dict(spec["messages"][index])
    message["name"] = draw(_names.filter(lambda n: n != message.get("name")))
    spec["messages"][index] = message


def _mutate_tools(spec: Spec, draw: Draw) -> None:
    tools = list(spec.get("tools", []))
    if tools and draw(st.booleans()):
        tool = json.loads(json.dumps(tools[0]))
        tool["function"]["name"] += "_v2"
        tools[0] = tool
    else:
        tools.append(draw(_tool()))
    spec["tools"] = tools


def _mutate_tool_choice(spec: Spec, draw: Draw) -> None:
    spec.setdefault("tools", [draw(_tool())])
    current = spec.get("tool_choice", "auto")
    spec["tool_choice"] = draw(st.sampled_from(["auto", "none", "required"]).filter(lambda c: c != current))


def _mutate_response_format(spec: Spec, draw: Draw) -> None:
    current = spec.get("response_format", {"type": "text"})
    spec["response_format"] = (
        {"type": "json_object"} if current["type"] != "json_object" else {"type": "text"}
    )


MUTATIONS: dict[str, Callable[[Spec, Draw], None]] = {
    "model": _mutate_model,
    "temperature": _mutate_temperature,
    "top_p": _mutate_top_p,
    "penalty": _mutate_penalty,
    "seed": _mutate_seed,
    "stop": _mutate_stop,
    "max_tokens": _mutate_max_tokens,
    "n": _mutate_n,
    "logit_bias": _mutate_logit_bias,
    "content": _mutate_content,
    "role": _mutate_role,
    "message_count": _mutate_message_count,
    "name": _mutate_name,
    "tools": _mutate_tools,
    "tool_choice": _mutate_tool_choice,
    "response_format": _mutate_response_format,
}
"""Answer-changing edits of a spec, by name; each is guaranteed to change the request's meaning."""
