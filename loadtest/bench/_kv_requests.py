"""How a side of the kv benchmarks sends one chat request and reads its outcome (TTFT, the server's ``timings``),
plain or streamed: shared by every side (:mod:`loadtest.bench._kv_sides`, :mod:`loadtest.bench._kv_contextpilot`)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from loadtest.bench._kv_servers import MODEL_ID
from loadtest.goodput import AFTER_WAIT, AT_ARRIVAL, ERROR, OK, REJECTED, Outcome
from proxy.kv.stages import SLO_AFTER_WAIT, SLO_AT_ARRIVAL

_REFUSALS = {SLO_AT_ARRIVAL: AT_ARRIVAL, SLO_AFTER_WAIT: AFTER_WAIT}
"""The proxy's 429 error codes, by the refusal each says."""


def chat_body(messages: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL_ID, "messages": messages, "max_tokens": 1, "temperature": 0}
    if stream:
        body["stream"] = True
    return body


def outcome_of(started: float, status: int, content: bytes) -> Outcome:
    """An answered request's outcome from its reply (the server's ``timings``), or an error."""
    elapsed = time.perf_counter() - started
    if status != 200:
        return Outcome(ERROR, elapsed)
    return _answered(elapsed, orjson.loads(content or b"{}").get("timings", {}))


def refusal(started: float, code: object) -> Outcome:
    """A 429's outcome: :data:`~loadtest.goodput.REJECTED`, at arrival or after waiting as its error ``code`` says."""
    kind = _REFUSALS.get(code) if isinstance(code, str) else None
    return Outcome(REJECTED, time.perf_counter() - started, refused=kind)


def error_code(body: bytes) -> object:
    """The ``code`` of an error body in OpenAI's shape (``None`` when the body is not one)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def _count_error(statuses: Counter[int], url: str, status: int, body: bytes) -> None:
    """Count a reply other than 200; one other than a 429 (a refusal) is also written to stderr with the start of
    its body (its ``code`` says which stage failed), so that a run's errors can be traced to their cause."""
    statuses[status] += 1
    if status != 429:
        print(f"{url}: {status} {body[:400].decode(errors='replace')}", file=sys.stderr)


def _answered(ttft_s: float, timings: Mapping[str, Any]) -> Outcome:
    return Outcome(OK, ttft_s, int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0)),
                   float(timings.get("prompt_ms", 0.0)))


async def post_chat(client: httpx.AsyncClient, url: str, body: dict[str, Any], statuses: Counter[int],
                    headers: Mapping[str, str] | None = None) -> Outcome:
    """POST a chat request; a streamed one's TTFT is the arrival of its first chunk with content (or its end),
    its timings those of the chunk that carries them. A 429 is :data:`~loadtest.goodput.REJECTED` (:func:`refusal`);
    every other status but 200 an error, counted in ``statuses``."""
    started = time.perf_counter()
    if not body.get("stream"):
        response = await client.post(url, json=body, headers=headers)
        if response.status_code != 200:
            _count_error(statuses, url, response.status_code, response.content)
        if response.status_code == 429:
            return refusal(started, error_code(response.content))
        return outcome_of(started, response.status_code, response.content)
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            content = await response.aread()
            _count_error(statuses, url, response.status_code, content)
            if response.status_code == 429:
                return refusal(started, error_code(content))
            return Outcome(ERROR, time.perf_counter() - started)
        first: float | None = None
        timings: Mapping[str, Any] = {}
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = orjson.loads(line[5:])
            if first is None and any(c.get("delta", {}).get("content") or c.get("finish_reason")
                                     for c in chunk.get("choices") or ()):
                first = time.perf_counter() - started
            timings = chunk.get("timings") or timings
    if not timings:
        statuses[-1] += 1  # a stream that ended without the server's timings: cut short
        return Outcome(ERROR, time.perf_counter() - started)
    return _answered(first if first is not None else time.perf_counter() - started, timings)
