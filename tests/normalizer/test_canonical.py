"""Table tests of canonical requests: each documented equivalence, each kept distinction, each endpoint."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from normalizer.canonical import (
    EXCLUDED_FIELDS,
    KeyScope,
    cache_key,
    canonical_chat,
    canonical_completion,
    canonical_embedding_items,
)
from normalizer.canonical_json import CanonicalizationError, canonical_bytes, canonical_number
from normalizer.canonical_request import chat_request

SCOPE = KeyScope("acme")
USER = {"role": "user", "content": "What is RAG?"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


def key(body: dict[str, Any]) -> str:
    return cache_key("chat", canonical_chat(body), SCOPE)


SAME = [
    ("temperature default", chat(), chat(temperature=1.0)),
    ("float formatting", chat(temperature=1), chat(temperature=1.0)),
    ("top_p default", chat(), chat(top_p=1)),
    ("penalties default", chat(), chat(presence_penalty=0.0, frequency_penalty=0)),
    ("null is omitted", chat(), chat(seed=None, stop=None, tools=None, max_tokens=None)),
    ("stop string vs list", chat(stop="\n"), chat(stop=["\n"])),
    ("stop is a set", chat(stop=["a", "b"]), chat(stop=["b", "a", "b"])),
    ("empty stop", chat(), chat(stop=[])),
    ("max_completion_tokens", chat(max_tokens=5), chat(max_completion_tokens=5)),
    ("logit_bias zero", chat(), chat(logit_bias={"42": 0})),
    ("response_format text", chat(), chat(response_format={"type": "text"})),
    ("tool_choice default", chat(), chat(tool_choice="none", parallel_tool_calls=True)),
    ("n default", chat(), chat(n=1, logprobs=False)),
    (
        "string vs single text part",
        chat(),
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "What is RAG?"}]}]),
    ),
    (
        "image detail default",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "auto"}}],
                }
            ]
        ),
    ),
    ("excluded fields", chat(), chat(**{name: {"x": 1} for name in EXCLUDED_FIELDS})),
    (
        "tool strict default and key order",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
        chat(
            tools=[
                {
                    "function": {"parameters": {"type": "object"}, "strict": False, "name": "f"},
                    "type": "function",
                }
            ],
            tool_choice="auto",
        ),
    ),
    (
        "json schema response format number formatting",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"maximum": 1}}}),
        chat(
            response_format={"json_schema": {"schema": {"maximum": 1.0}, "name": "a"}, "type": "json_schema"}
        ),
    ),
]


@pytest.mark.parametrize(("case", "first", "second"), SAME, ids=[case for case, _, _ in SAME])
def test_equivalent_requests_share_a_key(case: str, first: dict[str, Any], second: dict[str, Any]) -> None:
    assert key(first) == key(second)


def _tool(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": properties}},
    }


DIFFERENT = [
    ("temperature", chat(), chat(temperature=0)),
    (
        "two text parts vs one string",
        chat(messages=[{"role": "user", "content": "ab"}]),
        chat(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ]
        ),
    ),
    (
        "empty content vs no content",
        chat(messages=[{"role": "assistant", "content": ""}]),
        chat(messages=[{"role": "assistant"}]),
    ),
    (
        "system vs developer",
        chat(messages=[{"role": "system", "content": "x"}, USER]),
        chat(messages=[{"role": "developer", "content": "x"}, USER]),
    ),
    (
        "tool call id",
        chat(messages=[{"role": "tool", "tool_call_id": "a", "content": "1"}]),
        chat(messages=[{"role": "tool", "tool_call_id": "b", "content": "1"}]),
    ),
    (
        "schema property order",
        chat(tools=[_tool({"a": {}, "b": {}})]),
        chat(tools=[_tool({"b": {}, "a": {}})]),
    ),
    (
        "tool order",
        chat(tools=[_tool({"a": {}}), {"type": "function", "function": {"name": "g"}}]),
        chat(tools=[{"type": "function", "function": {"name": "g"}}, _tool({"a": {}})]),
    ),
    ("parallel_tool_calls", chat(tools=[_tool({})]), chat(tools=[_tool({})], parallel_tool_calls=False)),
    ("both max token limits differ", chat(max_tokens=5), chat(max_tokens=5, max_completion_tokens=6)),
    ("unknown field kept", chat(), chat(top_k=5)),
    ("service tier", chat(), chat(service_tier="flex")),
    (
        "image detail",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "low"}}],
                }
            ]
        ),
    ),
    (
        "json schema strict",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}),
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {}, "strict": True},
            }
        ),
    ),
]


@pytest.mark.parametrize(("case", "first", "second"), DIFFERENT, ids=[case for case, _, _ in DIFFERENT])
def test_different_requests_get_different_keys(
    case: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert key(first) != key(second)


def test_schema_keywords_other_than_properties_are_order_free() -> None:
    first = {"type": "object", "properties": {"a": {"type": "string", "description": "x"}}, "required": ["a"]}
    second = {
        "required": ["a"],
        "properties": {"a": {"description": "x", "type": "string"}},
        "type": "object",
    }
    tools = [
        [{"type": "function", "function": {"name": "f", "parameters": schema}}] for schema in (first, second)
    ]
    assert key(chat(tools=tools[0])) == key(chat(tools=tools[1]))


@pytest.mark.parametrize(
    ("value", "expected"), [(1.0, 1), (-0.0, 0), (2.5, 2.5), (2.0**53 - 1, 2**53 - 1), (3, 3), (2**64 - 1, 2**64 - 1)]
)
def test_canonical_numbers(value: float, expected: float) -> None:
    result = canonical_number(value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("literal", [b"18446744073709551616", b"-9223372036854775809", b"1e20", b"9007199254740992.0"])
def test_a_float_that_may_be_a_rounded_big_integer_is_not_keyed(literal: bytes) -> None:
    value = orjson.loads(literal)  # orjson reads an integer beyond 64 bits as the nearest float
    assert isinstance(value, float)
    with pytest.raises(CanonicalizationError):
        canonical_number(value)


def test_booleans_stay_booleans() -> None:
    assert canonical_bytes({"a": True, "b": 1}) == b'{"a":true,"b":1}'


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [USER]},
        {"model": "m", "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [{"content": "no role"}]},
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
        chat(temperature="hot"),
        chat(temperature=float("nan")),
        chat(stop=[1]),
        chat(logit_bias={"token": 1}),
        chat(tools="f"),
    ],
)
def test_malformed_chat_bodies_raise(body: dict[str, Any]) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_chat(body)


def test_legacy_completion_equivalences_and_defaults() -> None:
    base = canonical_completion({"model": "m", "prompt": "Say hi"})
    assert base == canonical_completion({"model": "m", "prompt": ["Say hi"], "max_tokens": 16, "echo": False,
                                         "best_of": 1, "temperature": 1.0, "stream": True})  # fmt: skip
    assert base != canonical_completion({"model": "m", "prompt": "Say hi", "max_tokens": 17})
    assert canonical_completion({"model": "m", "prompt": [1, 2]}) == canonical_completion(
        {"model": "m", "prompt": [[1, 2]]}
    )
    assert canonical_completion({"model": "m", "prompt": ["a", "b"]}) != canonical_completion(
        {"model": "m", "prompt": ["b", "a"]}
    )


def test_embedding_items_are_one_request_per_input_in_order() -> None:
    items = canonical_embedding_items({"model": "e", "input": ["x", "y"], "user": "u"})
    assert [item["input"] for item in items] == ["x", "y"]
    single = canonical_embedding_items({"model": "e", "input": "x", "encoding_format": "float"})
    assert single == items[:1]
    assert canonical_embedding_items({"model": "e", "input": "x", "dimensions": 256}) != single
    assert canonical_embedding_items({"model": "e", "input": "x", "encoding_format": "base64"}) != single
    tokens = canonical_embedding_items({"model": "e", "input": [1, 2, 3]})
    assert len(tokens) == 1 and tokens[0]["input"] == [1, 2, 3]


def test_the_chat_canonicaliser_folds_the_final_question() -> None:
    assert chat_request(chat()) == {**canonical_chat(chat()), "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is RAG"}]}]}, "the final question is folded"
