"""Rate limits, budgets and their headers: the decisions, apart from the counters' I/O. Pure.

Every key, user and tenant may carry :class:`~proxy.core.handoffs.Limits` (set through the admin API, kept with the
keys): requests per minute, tokens per minute, and a budget of credits per period. A request counts against each of
its key's, its user's and its tenant's; the first that has no room refuses it.

**Requests and tokens per minute: a leaky bucket per scope** (the generic cell rate algorithm's bookkeeping: a level
that drains continuously at ``limit / 60`` per second, never below 0). A request fits when its level plus what it
asks (1 request; its estimated tokens) stays within the limit; it then adds to the level. So a scope takes ``limit``
at once after a quiet minute and ``limit`` per minute on average, with no burst of twice the limit at a window's edge
(which fixed one-minute windows allow). This is what OpenAI's headers describe: ``x-ratelimit-remaining-*`` is what
still fits now, ``x-ratelimit-reset-*`` the time until the bucket is empty again ("resets to its initial state"),
written as Go durations (``1s``, ``6m0s``, ``20ms``).

**Tokens** are counted at arrival as an estimate, as OpenAI's limiter does: the prompt's characters over
:data:`~proxy.credits.pricing.CHARS_PER_TOKEN` plus the output the request asks for at most (``max_tokens``,
``max_completion_tokens``, ``max_output_tokens``, times the choices; nothing when it sets none), and settled with the
usage the credits stage charges once the answer is complete (an answer from a cache tier settles at 0: no upstream
tokens). With credits off the estimate stands, and a request refused or failed gives its estimate back.

**Budgets: fixed windows** of the period, aligned in UTC: ``1d`` starts at midnight UTC, ``1mo`` on the first of the
month, ``<n>s/m/h/d`` at multiples of the period since 1970-01-01, ``<n>mo`` at multiples of ``n`` months since
January 1970; without a period the budget is for all time. A request is refused while what was charged in the
current window has reached the budget (LiteLLM's rule); what it is charged is added when it settles, so requests
already running when the budget runs out may overshoot it by their own cost.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxy.core.handoffs import Limits, Scope
from proxy.credits.pricing import PriceBook

SCOPE_KINDS = ("key", "user", "tenant")
"""What limits are set on, in the order a request is counted against them."""
MINUTE_S = 60.0
_DURATION = re.compile(r"([1-9][0-9]{0,3})(s|m|h|d|mo)")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_PROMPT_FIELDS = ("messages", "prompt", "input", "instructions")
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


# -- periods --

def check_duration(text: str) -> str:
    """``text`` if it is a period this module reads (``<n>s``, ``<n>m``, ``<n>h``, ``<n>d``, ``<n>mo``; n from 1 to
    9999), else :class:`ValueError`."""
    if _DURATION.fullmatch(text) is None:
        raise ValueError("a duration is <n>s, <n>m, <n>h, <n>d or <n>mo (n from 1 to 9999), e.g. 1d or 1mo")
    return text


def duration_seconds(text: str, now: float) -> float:
    """The length of ``text`` from ``now`` (epoch seconds): a key created with ``duration`` expires that much later
    (a month: to the same day and time of the next month, or its last day)."""
    count, unit = _parse(text)
    if unit != "mo":
        return float(count * _SECONDS[unit])
    start = datetime.fromtimestamp(now, UTC)
    month = start.month - 1 + count
    year, month = start.year + month // 12, month % 12 + 1
    day = min(start.day, _days_in(year, month))
    return start.replace(year=year, month=month, day=day).timestamp() - now


@dataclass(frozen=True, slots=True)
class Window:
    """The budget window containing a moment: ``[start, end)`` in epoch seconds (``end`` is infinite without a
    period)."""

    start: float
    end: float


def budget_window(duration: str | None, now: float) -> Window:
    """The fixed window of ``duration`` containing ``now`` (see the module docstring)."""
    if duration is None:
        return Window(0.0, math.inf)
    count, unit = _parse(duration)
    if unit != "mo":
        length = count * _SECONDS[unit]
        start = math.floor(now / length) * length
        return Window(float(start), float(start + length))
    moment = datetime.fromtimestamp(now, UTC)
    index = (moment.year - 1970) * 12 + moment.month - 1
    first = index - index % count
    return Window(_month_start(first), _month_start(first + count))


def _parse(text: str) -> tuple[int, str]:
    match = _DURATION.fullmatch(check_duration(text))
    assert match is not None
    return int(match.group(1)), match.group(2)


def _month_start(index: int) -> float:
    return datetime(1970 + index // 12, index % 12 + 1, 1, tzinfo=UTC).timestamp()


def _days_in(year: int, month: int) -> int:
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return (following - datetime(year, month, 1, tzinfo=UTC)).days


# -- the per-minute buckets --

@dataclass(frozen=True, slots=True)
class Level:
    """A scope's buckets: requests and tokens taken and not yet drained."""

    requests: float = 0.0
    tokens: float = 0.0


def drained(level: float, limit: int | None, elapsed_s: float) -> float:
    """``level`` after ``elapsed_s`` of draining at ``limit`` per minute (0 without a limit)."""
    if limit is None:
        return 0.0
    return max(0.0, level - max(0.0, elapsed_s) * limit / MINUTE_S)


def fits(level: Level, limits: Limits, tokens: int) -> bool:
    """Whether one more request asking for ``tokens`` fits into ``level`` (already drained to now)."""
    requests_fit = limits.rpm_limit is None or level.requests + 1 <= limits.rpm_limit
    tokens_fit = limits.tpm_limit is None or level.tokens + tokens <= limits.tpm_limit
    return requests_fit and tokens_fit


def taken(level: Level, limits: Limits, tokens: int) -> Level:
    """``level`` with one request of ``tokens`` added (on the buckets that have a limit)."""
    return Level(level.requests + (1 if limits.rpm_limit is not None else 0),
                 level.tokens + (tokens if limits.tpm_limit is not None else 0))


def adjusted(level: Level, requests: float, tokens: float) -> Level:
    """``level`` with ``requests`` and ``tokens`` added (negative: given back), never below 0."""
    return Level(max(0.0, level.requests + requests), max(0.0, level.tokens + tokens))


def empty_after_s(level: Level, limits: Limits) -> float:
    """Seconds until both buckets are empty (how long a counter must be kept)."""
    return max(_seconds_to_drain(level.requests, limits.rpm_limit), _seconds_to_drain(level.tokens, limits.tpm_limit))


def _seconds_to_drain(amount: float, limit: int | None) -> float:
    return 0.0 if limit is None or amount <= 0 else amount * MINUTE_S / limit


# -- what a request asks --

def arrival_tokens(body: Mapping[str, Any] | None, prices: PriceBook, raw_size: int | None = None) -> int:
    """The tokens a request is counted for at arrival: its estimated prompt and the output it asks for at most (see
    the module docstring); 0 for a body with no prompt (a Qdrant request, a pass-through)."""
    if body is None or not any(body.get(name) for name in _PROMPT_FIELDS):
        return 0
    output = next((value for name in _OUTPUT_FIELDS
                   if isinstance(value := body.get(name), int) and not isinstance(value, bool) and value > 0), 0)
    choices = body.get("n")
    choices = choices if isinstance(choices, int) and not isinstance(choices, bool) and choices > 0 else 1
    return prices.prompt_estimate(body, raw_size) + output * choices


# -- answers --

def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration, the way OpenAI writes ``x-ratelimit-reset-*``: ``0s``, ``20ms``, ``1s``,
    ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    millis = math.ceil(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True, slots=True)
class Counted:
    """One scope's buckets once a request was counted against them."""

    scope: Scope
    level: Level


def rate_headers(counted: Sequence[Counted]) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for requests and tokens, each from the scope with the least room left (none
    for a kind no scope limits)."""
    headers: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        limited = [(limit, c.level.requests if kind == "requests" else c.level.tokens) for c in counted
                   if (limit := c.scope.limits.rpm_limit if kind == "requests" else c.scope.limits.tpm_limit)
                   is not None]
        if not limited:
            continue
        limit, level = min(limited, key=lambda pair: pair[0] - pair[1])
        headers[f"x-ratelimit-limit-{kind}"] = str(limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(limit - level)))
        headers[f"x-ratelimit-reset-{kind}"] = go_duration(level * MINUTE_S / limit)
    return headers


def wait_s(level: Level, limits: Limits, tokens: int) -> float:
    """Seconds until a request of ``tokens`` fits into ``level`` (``inf`` when it never can)."""
    waits = [0.0]
    if limits.rpm_limit is not None:
        waits.append((level.requests + 1 - limits.rpm_limit) * MINUTE_S / limits.rpm_limit)
    if limits.tpm_limit is not None:
        if tokens > limits.tpm_limit:
            return math.inf
        waits.append((level.tokens + tokens - limits.tpm_limit) * MINUTE_S / limits.tpm_limit)
    return max(waits)


def retry_headers(seconds: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) and ``retry-after-ms`` (which the OpenAI SDKs read first)."""
    return {"Retry-After": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}
