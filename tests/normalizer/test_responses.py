"""Responses API requests: each documented equivalence of the key, each kept distinction, the bypass rules."""

from __future__ import annotations

from typing import Any

import pytest

from normalizer.bypass import RESPONSE_RULES, BypassSettings, bypass_reason
from normalizer.canonical import KeyScope, cache_key
from normalizer.canonical_json import CanonicalizationError
from normalizer.canonical_request import chat_request, response_request
from normalizer.documents import DocumentRegistry
from normalizer.responses import (
    RESPONSE_EXCLUDED_FIELDS,
    canonical_response,
    echo_request,
    final_input_question,
    one_replica_reason,
    prompt_messages,
    read_response_prompt,
    semantic_question,
    state_reason,
)

SCOPE = KeyScope("acme")
QUESTION = "What is RAG?"
FUNCTION = {"type": "function", "name": "lookup", "description": "Look up",
            "parameters": {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}},
            "strict": True}


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": QUESTION, "store": False, **fields}


def stored(**fields: Any) -> dict[str, Any]:
    """A request the upstream stores (no ``store``: the API's default)."""
    return {"model": "m", "input": QUESTION, **fields}


def key(body: dict[str, Any]) -> str:
    return cache_key("response", canonical_response(body), SCOPE)


def as_item(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


SAME = [
    ("string input is one user message", request(), request(input=[as_item(QUESTION)])),
    ("easy message: type and string content", request(input=[{"role": "user", "content": QUESTION}]),
     request(input=[as_item(QUESTION)])),
    ("null is omitted", request(), request(instructions=None, tools=None, reasoning=None, max_output_tokens=None)),
    ("sampling defaults", request(), request(temperature=1.0, top_p=1)),
    ("truncation default", request(), request(truncation="disabled")),
    ("text format default", request(), request(text={"format": {"type": "text"}})),
    ("empty reasoning", request(), request(reasoning={})),
    ("tool_choice default with tools", request(tools=[FUNCTION]), request(tools=[FUNCTION], tool_choice="auto")),
    ("parallel_tool_calls default", request(tools=[FUNCTION]), request(tools=[FUNCTION], parallel_tool_calls=True)),
    ("include is a set", request(include=["reasoning.encrypted_content", "file_search_call.results"]),
     request(include=["file_search_call.results", "reasoning.encrypted_content", "file_search_call.results"])),
    ("empty include", request(), request(include=[])),
    ("image detail default", request(input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://x/y.png"}]}]),
     request(input=[{"role": "user", "content": [
         {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}]}])),
    *[(f"excluded {name}", request(), request(**{name: value}))
      for name, value in [("user", "u1"), ("metadata", {"a": "b"}), ("safety_identifier", "s"),
                          ("prompt_cache_key", "k"), ("prompt_cache_retention", "24h"), ("stream", True),
                          ("stream_options", {"include_obfuscation": False})]],
    ("stored: store omitted is store true", stored(), stored(store=True)),
    ("stored: null and empty metadata are none", stored(), stored(metadata={})),
    *[(f"stored: excluded {name}", stored(), stored(**{name: value}))
      for name, value in [("prompt_cache_retention", "24h"), ("stream", True)]],
]

DIFFERENT = [
    ("question", request(), request(input="What is KV?")),
    ("role", request(input=[as_item(QUESTION)]), request(input=[as_item(QUESTION, "developer")])),
    ("instructions", request(), request(instructions="Be brief.")),
    ("input_text vs output_text", request(input=[as_item("x", "assistant")]), request(input=[
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}])),
    ("several parts stay apart", request(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]),
     request(input=[{"role": "user", "content": "a\nb"}])),
    ("schema property order", request(tools=[FUNCTION]), request(tools=[{**FUNCTION, "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}])),
    ("strict not defaulted", request(tools=[FUNCTION]), request(tools=[{**FUNCTION, "strict": None}])),
    ("tool_choice", request(tools=[FUNCTION]), request(tools=[FUNCTION], tool_choice="required")),
    ("text format", request(), request(text={"format": {"type": "json_object"}})),
    ("verbosity", request(), request(text={"verbosity": "low"})),
    ("reasoning effort", request(), request(reasoning={"effort": "low"})),
    ("max_output_tokens", request(), request(max_output_tokens=50)),
    ("temperature", request(), request(temperature=0.2)),
    ("truncation", request(), request(truncation="auto")),
    ("service_tier", request(), request(service_tier="flex")),
    ("include", request(), request(include=["reasoning.encrypted_content"])),
    ("function call output", request(input=[as_item(QUESTION), {"type": "function_call_output", "call_id": "c1",
                                                                 "output": "1"}]),
     request(input=[as_item(QUESTION), {"type": "function_call_output", "call_id": "c1", "output": "2"}])),
    ("unknown field kept", request(), request(top_k=3)),
    ("model", request(), request(model="n")),
    ("continued response", request(), request(previous_response_id="resp_1")),
    ("which response is continued", request(previous_response_id="resp_1"), request(previous_response_id="resp_2")),
    ("stored or not", request(), stored()),
    *[(f"stored: the object records {name}", stored(), stored(**{name: value}))
      for name, value in [("user", "u1"), ("metadata", {"a": "b"}), ("safety_identifier", "s"),
                          ("prompt_cache_key", "k")]],
]


@pytest.mark.parametrize(("name", "a", "b"), SAME, ids=[case[0] for case in SAME])
def test_equivalent_requests_share_a_key(name: str, a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(a) == key(b)


@pytest.mark.parametrize(("name", "a", "b"), DIFFERENT, ids=[case[0] for case in DIFFERENT])
def test_different_requests_never_share_a_key(name: str, a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(a) != key(b)


def test_a_response_key_is_never_a_chat_key() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}
    assert cache_key("response", response_request(request()), SCOPE) != \
        cache_key("chat", chat_request(chat), SCOPE)


@pytest.mark.parametrize("body", [
    {"input": QUESTION}, request(input=[]), request(input=5), request(input=[{"role": 3, "content": "x"}]),
    request(input=[{"role": "user", "content": [{"type": "input_text"}]}]), request(tools="x"),
    request(temperature="hot"), request(include="all"), request(text={"format": "text"}),
])
def test_malformed_bodies_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_response(body)


def test_every_excluded_field_has_a_reason() -> None:
    assert all(reason for reason in RESPONSE_EXCLUDED_FIELDS.values())


@pytest.mark.parametrize(("fields", "words"), [
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt template"),
    ({"background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
])
def test_state_the_key_cannot_see_bypasses(fields: dict[str, Any], words: str) -> None:
    reason = bypass_reason({**request(), **fields}, rules=RESPONSE_RULES)
    assert reason is not None and words in reason


def test_stored_and_continued_requests_are_cached_unless_configured_off() -> None:
    for body in (stored(), stored(previous_response_id="resp_1"), request(previous_response_id="resp_1")):
        assert state_reason(body) is None and bypass_reason(body, rules=RESPONSE_RULES) is None
    off = BypassSettings(cache_stored_responses=False)
    assert "cache_stored_responses is off" in str(bypass_reason(stored(), off, rules=RESPONSE_RULES))
    assert bypass_reason(request(), off, rules=RESPONSE_RULES) is None


def test_what_pins_a_request_to_one_replica() -> None:
    assert one_replica_reason(stored()) is None, "a new stored response may be made anywhere (its maker is recorded)"
    assert "previous_response_id" in str(one_replica_reason(request(previous_response_id="resp_1")))
    assert "conversation" in str(one_replica_reason(request(conversation="conv_1")))
    with pytest.raises(CanonicalizationError):
        canonical_response(request(previous_response_id=7))


def test_stored_requests_have_no_semantic_question() -> None:
    registry = DocumentRegistry()
    assert semantic_question(request(), read_response_prompt(request(), None, registry)) == QUESTION
    assert semantic_question(stored(), read_response_prompt(stored(), None, registry)) is None


def test_other_bypass_rules_apply_as_for_chat() -> None:
    assert bypass_reason(request(), rules=RESPONSE_RULES) is None
    assert bypass_reason(request(top_k=2), rules=RESPONSE_RULES) == "unknown field(s): top_k"
    assert bypass_reason(request(top_logprobs=2), rules=RESPONSE_RULES) == "top_logprobs requested"
    logprobs = request(include=["message.output_text.logprobs"])
    assert bypass_reason(logprobs, rules=RESPONSE_RULES) == "logprobs requested"
    assert bypass_reason(request(tools=[FUNCTION]), BypassSettings(cache_tool_calls=False), rules=RESPONSE_RULES)


def test_prompt_messages_keep_input_positions() -> None:
    body = request(instructions="Be brief.", input=[
        as_item("first"), {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "file_id": "f"},
                                     {"type": "input_text", "text": "b"}]}])
    assert prompt_messages(body) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"},
                                     {"role": "function_call"}, {"role": "user", "content": "a\nb"}]


def test_final_question_is_the_last_user_input() -> None:
    registry = DocumentRegistry()
    assert final_input_question(request(), read_response_prompt(request(), None, registry)) == QUESTION
    after_tool = request(input=[as_item(QUESTION), {"type": "function_call_output", "call_id": "c", "output": "1"}])
    assert final_input_question(after_tool, read_response_prompt(after_tool, None, registry)) is None
    only_instructions = request(instructions="hi", input=[as_item("x", "assistant")])
    assert final_input_question(only_instructions, read_response_prompt(only_instructions, None, registry)) is None


def test_documents_are_recognised_in_input_and_instructions() -> None:
    registry = DocumentRegistry()
    text = "The Eiffel Tower is 330 metres tall and stands in Paris since 1889."
    registry.add(text)
    in_input = request(input=[as_item(f"Context: {text}\n\nQuestion: how tall is it?")])
    prompt = read_response_prompt(in_input, None, registry)
    assert [d.text for d in prompt.documents] == [text]
    assert final_input_question(in_input, prompt) == "Context:\nQuestion: how tall is it?"
    in_instructions = request(instructions=f"Answer from: {text}")
    assert [d.text for d in read_response_prompt(in_instructions, None, registry).documents] == [text]
    with pytest.raises(ValueError, match="not supported on /v1/responses"):
        read_response_prompt(request(), [{"text": text}], registry)


def test_a_hit_echoes_the_request_s_own_fields() -> None:
    stored = {"id": "resp_1", "store": False, "metadata": {"run": "a"}, "user": "u1", "output": []}
    response = dict(stored)
    assert echo_request(response, {"store": False, "metadata": {"run": "b"}})
    assert response == {"id": "resp_1", "store": False, "metadata": {"run": "b"}, "user": None, "output": []}
    same = dict(stored)
    assert not echo_request(same, {"store": False, "metadata": {"run": "a"}, "user": "u1"})
