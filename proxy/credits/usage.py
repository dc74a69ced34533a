"""Token usage as backends report it, read from a JSON reply or a stream chunk. Pure.

Two dialects are understood:

* OpenAI (vLLM, SGLang, hosted APIs): ``usage.prompt_tokens``, ``usage.completion_tokens`` and
  ``usage.prompt_tokens_details.cached_tokens``; a stream carries it in a last chunk with empty ``choices``
  when the request asked for ``stream_options.include_usage``.
* llama.cpp server: ``timings.prompt_n`` (prompt tokens evaluated now), ``timings.cache_n`` (prompt tokens
  reused from its KV cache) and ``timings.predicted_n``; used for what ``usage`` leaves out (it rarely reports
  cached tokens), including the cached count when ``prompt_tokens_details`` is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one reply; ``cached_tokens`` is the part of ``prompt_tokens`` the backend reused."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def usage_from_json(payload: Mapping[str, Any]) -> Usage | None:
    """The usage in a reply object or stream chunk, or ``None`` when it reports none."""
    usage = _mapping(payload.get("usage"))
    timings = _mapping(payload.get("timings"))
    if not usage and not timings:
        return None
    prompt_n, cache_n = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is None and (prompt_n is not None or cache_n is not None):
        prompt = (prompt_n or 0) + (cache_n or 0)
    completion = _count(usage.get("completion_tokens"))
    if completion is None:
        completion = _count(timings.get("predicted_n"))
    cached = _count(_mapping(usage.get("prompt_tokens_details")).get("cached_tokens"))
    if cached is None:
        cached = cache_n
    if prompt is None and completion is None:
        return None
    prompt = prompt or 0
    return Usage(prompt, completion or 0, min(cached or 0, prompt))


def usage_from_body(body: bytes) -> Usage | None:
    """The usage of a complete JSON reply body."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return usage_from_json(payload) if isinstance(payload, dict) else None


