"""Bypass rules for requests and the storage rule for responses."""

from __future__ import annotations

from typing import Any

import pytest

from normalizer.bypass import (
    CHAT_RULES,
    COMPLETION_RULES,
    EMBEDDING_RULES,
    RERANK_RULES,
    RESPONSE_RULES,
    BypassSettings,
    bypass_reason,
    sampled_caching_allowed,
    unstorable_reason,
)
from normalizer.canonical import RequestKind

RULES = {"chat": CHAT_RULES, "completion": COMPLETION_RULES, "response": RESPONSE_RULES, "embedding": EMBEDDING_RULES,
         "rerank": RERANK_RULES}

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": MESSAGES, **fields}


CACHEABLE: list[tuple[str, RequestKind, Any]] = [
    ("plain chat", "chat", chat()),
    ("greedy", "chat", chat(temperature=0)),
    ("sampled by default", "chat", chat(temperature=0.7)),
    ("n=1", "chat", chat(n=1)),
    ("logprobs false", "chat", chat(logprobs=False)),
    ("excluded fields are known", "chat", chat(stream=True, user="u", metadata={}, cache={"ttl": 5})),
    (
        "tools",
        "chat",
        chat(tools=[{"type": "function", "function": {"name": "f"}}], parallel_tool_calls=True),
    ),
    ("embeddings", "embedding", {"model": "e", "input": ["a"], "dimensions": 8, "user": "u"}),
    ("completion", "completion", {"model": "m", "prompt": "p", "best_of": 2, "echo": True}),
    ("rerank of the most documents cached", "rerank", {"model": "r", "query": "q", "documents": ["d"] * 1000}),
]


@pytest.mark.parametrize(("case", "kind", "body"), CACHEABLE, ids=[c for c, _, _ in CACHEABLE])
def test_cacheable_requests_have_no_bypass_reason(case: str, kind: RequestKind, body: Any) -> None:
    assert bypass_reason(body, BypassSettings(), rules=RULES[kind]) is None


BYPASSED: list[tuple[str, RequestKind, Any, str]] = [
    ("not an object", "chat", ["x"], "not a JSON object"),
    ("n>1", "chat", chat(n=3), "n=3"),
    ("logprobs", "chat", chat(logprobs=True), "logprobs"),
    ("top_logprobs", "chat", chat(top_logprobs=2), "top_logprobs"),
    ("legacy logprobs", "completion", {"model": "m", "prompt": "p", "logprobs": 0}, "logprobs"),
    ("unknown field", "chat", chat(top_k=4, mirostat=1), "unknown field(s): mirostat, top_k"),
    ("chat field on embeddings", "embedding", {"model": "e", "input": "a", "temperature": 0}, "temperature"),
    ("audio output", "chat", chat(modalities=["text", "audio"]), "audio"),
    ("more documents than are cached one by one", "rerank",
     {"model": "r", "query": "q", "documents": ["d"] * 1001}, "1001 documents: more than 1000"),
    ("more score pairs than are cached one by one", "rerank",
     {"model": "r", "text_1": "q", "text_2": ["d"] * 1001}, "1001 documents"),
]


@pytest.mark.parametrize(("case", "kind", "body", "reason"), BYPASSED, ids=[c for c, *_ in BYPASSED])
def test_bypassed_requests_name_their_reason(case: str, kind: RequestKind, body: Any, reason: str) -> None:
    result = bypass_reason(body, BypassSettings(), rules=RULES[kind])
    assert result is not None and reason in result


def test_unknown_fields_can_be_ignored_or_declared() -> None:
    assert bypass_reason(chat(top_k=4), BypassSettings(unknown_fields="ignore")) is None
    assert bypass_reason(chat(top_k=4), BypassSettings(extra_known_fields=frozenset({"top_k"}))) is None


def test_sampled_rule_per_namespace_then_model_then_default() -> None:
    settings = BypassSettings(
        cache_sampled=True,
        cache_sampled_by_model={"gpt-4o*": False},
        cache_sampled_by_namespace={"faq": True, "creative-*": False},
    )
    assert sampled_caching_allowed(settings, "gpt-4o-mini", "faq") is True
    assert sampled_caching_allowed(settings, "llama", "creative-writing") is False
    assert sampled_caching_allowed(settings, "gpt-4o", "other") is False
    assert sampled_caching_allowed(settings, "llama", "other") is True
    assert bypass_reason(chat(), settings, namespace="other") is not None  # omitted temperature is 1
    assert bypass_reason(chat(temperature=0), settings, namespace="other") is None
    assert bypass_reason(chat(temperature=0.5), BypassSettings(cache_sampled=False)) is not None


def test_tool_caching_switch() -> None:
    body = chat(tools=[{"type": "function", "function": {"name": "f"}}])
    assert bypass_reason(body, BypassSettings(cache_tool_calls=False)) is not None
    assert bypass_reason(chat(tools=[]), BypassSettings(cache_tool_calls=False)) is None


@pytest.mark.parametrize(
    ("status", "complete", "carried_error", "storable"),
    [
        (200, True, False, True),
        (200, False, False, False),
        (200, True, True, False),
        (201, True, False, False),
        (429, True, False, False),
        (500, True, False, False),
    ],
)
def test_only_complete_200_responses_are_storable(
    status: int, complete: bool, carried_error: bool, storable: bool
) -> None:
    assert (unstorable_reason(status, complete=complete, carried_error=carried_error) is None) is storable
