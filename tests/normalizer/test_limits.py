"""The pure limit checks (normalizer.limits): depth counting, item counts, batch shapes, prefetch depth."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from normalizer.limits import (
    RequestLimits,
    chat_shape,
    check_llm,
    check_search,
    embedding_shape,
    json_depth,
    rerank_shape,
    response_shape,
    score_shape,
)

LIMITS = RequestLimits(json_depth=5, embedding_inputs=3, search_batch=2, prefetch_depth=2, rerank_documents=3)


def nested(depth: int) -> Any:
    value: Any = 1
    for n in range(depth):
        value = [value] if n % 2 else {"a": value}
    return value


@pytest.mark.parametrize("depth", [0, 1, 2, 7])
def test_json_depth_counts_containers(depth: int) -> None:
    assert json_depth(nested(depth), 100) == depth


def test_json_depth_stops_counting_past_the_limit() -> None:
    assert json_depth(nested(500), 5) == 6


SHAPES = {"chat": chat_shape, "responses": response_shape, "embeddings": embedding_shape, "rerank": rerank_shape,
          "score": score_shape}


def _llm(route: str, body: dict[str, Any]) -> tuple[int, str] | None:
    exceeded = check_llm(body, orjson.dumps(body), LIMITS, SHAPES.get(route))
    return None if exceeded is None else (exceeded.status, exceeded.code)


def test_llm_bodies() -> None:
    assert _llm("chat", {"messages": [{"content": nested(2)}]}) is None  # body, messages, message + 2 levels
    assert _llm("chat", {"messages": [{"content": nested(3)}]}) == (400, "nesting_too_deep")
    assert _llm("embeddings", {"input": ["a", "b", "c"]}) is None
    assert _llm("embeddings", {"input": [1, 2, 3, 4, 5]}) is None, "one token list is one input"
    assert _llm("embeddings", {"input": ["a", "b", "c", "d"]}) == (413, "too_many_inputs")
    assert _llm("chat", {"input": ["a", "b", "c", "d"]}) is None, "the item count is the embeddings route's"


def test_reranker_bodies() -> None:
    assert _llm("rerank", {"query": "q", "documents": ["a", "b", "c"]}) is None
    assert _llm("rerank", {"query": "q", "documents": ["a", "b", "c", "d"]}) == (413, "too_many_documents")
    assert _llm("score", {"text_1": "q", "text_2": ["a", "b", "c", "d"]}) == (413, "too_many_documents")
    assert _llm("rerank", {"query": "q", "texts": ["a", "b", "c", "d"]}) == (413, "too_many_documents")
    assert _llm("rerank", {"query": "q", "documents": [1]}) == (400, "invalid_type")
    assert _llm("rerank", {"query": "q", "documents": ["a"], "top_n": "x"}) == (400, "invalid_type")
    assert _llm("score", {"text_1": "q", "text_2": [None]}) == (400, "invalid_type")


@pytest.mark.parametrize("document", [{"text": 5}, {}, {"content": "x"}, {"image": 5}, {"text": None}])
@pytest.mark.parametrize("route, field", [("rerank", "documents"), ("rerank", "texts"), ("score", "text_2")])
def test_reranker_document_objects_of_wrong_types(route: str, field: str, document: dict[str, Any]) -> None:
    body = {"query": "q", field: [document]} if route == "rerank" else {"text_1": "q", field: [document]}
    assert _llm(route, body) == (400, "invalid_type")


def test_reranker_document_objects_of_the_servers_shapes() -> None:
    assert _llm("rerank", {"query": "q", "documents": [{"text": "a"}, "b"]}) is None
    assert _llm("rerank", {"query": "q", "documents": [{"image": "https://x/a.png"}]}) is None, "Jina"
    assert _llm("rerank", {"query": "q", "documents": [{"content": [{"type": "image_url"}]}]}) is None, "vLLM"
    assert _llm("rerank", {"query": "q", "documents": [{"title": "t"}], "rank_fields": ["title"]}) is None, "Cohere"
    assert _llm("score", {"text_1": {"content": [{"type": "text", "text": "q"}]}, "text_2": "a"}) is None
    assert _llm("score", {"text_1": {"content": "q"}, "text_2": "a"}) == (400, "invalid_type")


@pytest.mark.parametrize("field, value", [
    ("text", 5), ("text", "plain"), ("reasoning", "high"), ("previous_response_id", ["a"]), ("model", 5),
    ("include", "x"), ("include", [1]), ("temperature", "hot"), ("top_p", True), ("max_output_tokens", "9"),
    ("store", "no"), ("stream", 1), ("metadata", []), ("instructions", 5), ("conversation", 5), ("tool_choice", 5),
    ("background", "yes"),
])  # fmt: skip
def test_responses_fields_of_wrong_types(field: str, value: Any) -> None:
    assert _llm("responses", {"model": "m", "input": "hi", field: value}) == (400, "invalid_type")


@pytest.mark.parametrize("item", [
    {"role": "user", "content": 5}, {"role": 5, "content": "x"}, {"role": "user", "content": ["x"]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]},
    {"role": "assistant", "content": [{"type": "output_text"}]},
])  # fmt: skip
def test_responses_message_items_of_wrong_types(item: dict[str, Any]) -> None:
    assert _llm("responses", {"model": "m", "input": [item]}) == (400, "invalid_type")


def test_responses_items_the_upstream_judges() -> None:
    items = [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}, {"role": "user"},
             {"type": "function_call_output", "call_id": "c", "output": 5}, {"type": "item_reference", "id": "i"}]
    assert _llm("responses", {"model": "m", "input": items}) is None


def test_responses_fields_of_the_right_types() -> None:
    body = {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}, "reasoning": {"effort": "high"},
            "previous_response_id": "resp_1", "include": ["x"], "temperature": 0.5, "top_p": 1,
            "max_output_tokens": 9, "store": False, "stream": True, "metadata": {"a": "b"}, "instructions": "be brief",
            "conversation": {"id": "conv_1"}, "tool_choice": "auto", "background": False}
    assert _llm("responses", body) is None
    assert _llm("responses", {**body, "text": None, "reasoning": None, "previous_response_id": None}) is None


def test_responses_and_chat_bodies() -> None:
    assert _llm("responses", {"input": "hi"}) is None
    assert _llm("responses", {"input": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search"}]}) is None
    assert _llm("responses", {"input": [1]}) == (400, "invalid_type")
    assert _llm("responses", {"input": {"role": "user"}}) == (400, "invalid_type")
    assert _llm("responses", {"input": "hi", "tools": "junk"}) == (400, "invalid_type")
    assert _llm("chat", {"messages": [], "tools": ["junk"]}) == (400, "invalid_type")
    assert _llm("chat", {"messages": [], "tools": None}) is None, "null is absent"
    assert _llm("completions", {"prompt": "x", "tools": "junk"}) is None, "no tools on legacy completions"


def _search(batch: bool, body: dict[str, Any]) -> tuple[int, str] | None:
    exceeded = check_search(batch, body, orjson.dumps(body), RequestLimits(json_depth=20, search_batch=2,
                                                                           prefetch_depth=2))
    return None if exceeded is None else (exceeded.status, exceeded.code)


def test_search_bodies() -> None:
    assert _search(True, {"searches": [{"vector": [1]}, {"vector": [2]}]}) is None
    assert _search(True, {"searches": [{}, {}, {}]}) == (413, "batch_too_large")
    for searches in ("abc", [1, 2], None, [{"vector": [1]}, "x"]):
        assert _search(True, {"searches": searches}) == (400, "invalid_batch")
    assert _search(False, {"prefetch": {"prefetch": {"limit": 1}}}) is None
    assert _search(False, {"prefetch": [{"limit": 1}, {"prefetch": {"prefetch": {}}}]}) == (400, "prefetch_too_deep")
    assert _search(True, {"searches": [{"prefetch": {"prefetch": {"prefetch": {}}}}]}) == (400, "prefetch_too_deep")
