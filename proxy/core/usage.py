"""Token usage as backends report it, read from a JSON reply or a stream chunk. Pure.

Three dialects are understood:

* OpenAI (vLLM, SGLang, hosted APIs): ``usage.prompt_tokens``, ``usage.completion_tokens`` and
  ``usage.prompt_tokens_details.cached_tokens``; a stream carries it in a last chunk with empty ``choices``
  when the request asked for ``stream_options.include_usage``.
* llama.cpp server: ``timings.prompt_n`` (prompt tokens evaluated now), ``timings.cache_n`` (prompt tokens
  reused from its KV cache) and ``timings.predicted_n``; used for what ``usage`` leaves out (it rarely reports
  cached tokens), including the cached count when ``prompt_tokens_details`` is absent.
* OpenAI Responses API: ``usage.input_tokens``, ``usage.output_tokens`` and
  ``usage.input_tokens_details.cached_tokens``, in the response object; a stream carries it in the response of
  its terminal event (``response.completed`` or ``response.incomplete``), always (no option asks for it).
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


def _first(*values: Any) -> int | None:
    """The first of ``values`` that is a token count."""
    for value in values:
        if (count := _count(value)) is not None:
            return count
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def client_asked_for_usage(body: Mapping[str, Any] | None) -> bool:
    """Whether a request sets ``stream_options.include_usage`` (its stream then ends with a usage chunk)."""
    options = body.get("stream_options") if body else None
    return isinstance(options, Mapping) and options.get("include_usage") is True


RESPONSE_TERMINAL = frozenset({"response.completed", "response.incomplete"})
"""The events that end a streamed Responses reply, carrying the whole response object."""


def reply_object(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object holding ``usage`` (and llama.cpp's ``timings``): a reply or stream chunk itself, or the response a
    Responses stream's terminal event carries."""
    return _mapping(payload.get("response")) if payload.get("type") in RESPONSE_TERMINAL else payload


def usage_from_json(payload: Mapping[str, Any]) -> Usage | None:
    """The usage in a reply object or stream chunk (or Responses event), or ``None`` when it reports none."""
    payload = reply_object(payload)
    usage = _mapping(payload.get("usage"))
    timings = _mapping(payload.get("timings"))
    if not usage and not timings:
        return None
    prompt_n, cache_n = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
    prompt = _first(usage.get("prompt_tokens"), usage.get("input_tokens"))
    if prompt is None and (prompt_n is not None or cache_n is not None):
        prompt = (prompt_n or 0) + (cache_n or 0)
    completion = _first(usage.get("completion_tokens"), usage.get("output_tokens"), timings.get("predicted_n"))
    cached = _first(_mapping(usage.get("prompt_tokens_details")).get("cached_tokens"),
                    _mapping(usage.get("input_tokens_details")).get("cached_tokens"), cache_n)
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


