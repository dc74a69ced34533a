"""The rate_limits stage: requests and tokens per minute and budgets of a request's key, user and tenant.

It runs right after identify, before everything else (request limits, idempotency, credits, every cache lookup):
a request is a request whatever answers it, so a cached answer counts against requests per minute like any other,
and a flood is cut before it costs the proxy any further work. What each limit means, and why the buckets leak and
the budgets keep fixed windows: :mod:`proxy.rate_limits.decisions`.

On the way in, for each limited scope (key, then user, then tenant): a budget whose window has been spent refuses
the request (429 ``insufficient_quota``, ``Retry-After`` until the window ends); then one request and its estimated
tokens are taken from each scope's buckets, atomically per scope (:mod:`proxy.rate_limits.counters`); the first
that has no room refuses it (429 ``rate_limit_exceeded``, its ``type`` ``requests`` or ``tokens`` as OpenAI's are,
``Retry-After`` and ``retry-after-ms`` until it fits), and what the scopes before it took is given back. A request
asking for more tokens than a per-minute limit allows at all is refused with ``x-should-retry: false`` (waiting
cannot help). Every answer of a limited request carries OpenAI's ``x-ratelimit-limit/remaining/reset-requests``
and ``-tokens`` headers, of the scope with the least room left.

On the way back: the credits stage tells the meter (:data:`~proxy.credits.stages.METERING`) what the request used
once it settles (the tokens the upstream processed, 0 for an answer from a cache tier; the micro-credits charged):
the tokens' estimate is corrected by the difference and the charge added to every budget's window. A request that
failed or was refused (an error status, an exception) and was never settled gives its tokens back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from proxy.auth.identify import QUOTA
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.handoffs import Quota, Scope
from proxy.core.pipeline import Next
from proxy.credits.pricing import PriceBook, format_credits
from proxy.credits.stages import METERING
from proxy.rate_limits.counters import LimitCounters
from proxy.rate_limits.decisions import (
    Counted,
    Level,
    arrival_tokens,
    budget_window,
    go_duration,
    rate_headers,
    retry_headers,
    wait_s,
)

log = logging.getLogger("ragproxy.credits")

_WHOSE = {"key": "the API key", "user": "the user", "tenant": "the tenant"}


class RateLimits:
    """Requests and tokens per minute and budgets, per key, user and tenant (see the module docstring)."""

    name = "rate_limits"
    needs = frozenset({QUOTA})
    gives = frozenset({METERING})

    def __init__(self, counters: LimitCounters, prices: PriceBook, *, refused: Counter[str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``prices``: what estimates a request's prompt tokens; ``refused``: requests refused, by the limit that
        refused them (kept by the runtime); ``clock``: wall time (epoch seconds)."""
        self.counters = counters
        self.prices = prices
        self.clock = clock
        self.refused = refused if refused is not None else Counter()
        self._background: set[asyncio.Task[None]] = set()

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        quota = ctx.handoffs.get(QUOTA)
        if quota is None:
            return await call_next(ctx)
        now = self.clock()
        await self._check_budgets(quota, now)
        counts_tokens = any(scope.limits.tpm_limit is not None for scope in quota.scopes)
        tokens = arrival_tokens(ctx.body, self.prices, len(ctx.raw_body) or None) if counts_tokens else 0
        counted = await self._take(quota, tokens, now)
        ctx.response_headers.update(rate_headers(counted))
        meter = _Meter(self, quota, tokens)
        ctx.handoffs[METERING] = meter
        try:
            reply = await call_next(ctx)
        except BaseException:
            meter.unused()
            raise
        if not 200 <= reply.status < 300:
            meter.unused()
        return reply

    async def _check_budgets(self, quota: Quota, now: float) -> None:
        for scope in quota.scopes:
            budget = scope.limits.max_budget
            if budget is None:
                continue
            window = budget_window(scope.limits.budget_duration, now)
            if await self.counters.spent(scope, window) < budget:
                continue
            self.refused["budget"] += 1
            period = f" per {scope.limits.budget_duration}" if scope.limits.budget_duration else ""
            resets = f"; it resets in {go_duration(window.end - now)}" if math.isfinite(window.end) else ""
            headers = retry_headers(window.end - now) if math.isfinite(window.end) else {"x-should-retry": "false"}
            raise ProxyError(429, f"You exceeded your current quota: {_WHOSE[scope.kind]}'s budget of "
                             f"{format_credits(budget)} credits{period} is spent{resets}.",
                             code="insufficient_quota", error_type="insufficient_quota", headers=headers)

    async def _take(self, quota: Quota, tokens: int, now: float) -> list[Counted]:
        counted: list[Counted] = []
        for scope in quota.scopes:
            if scope.limits.rpm_limit is None and scope.limits.tpm_limit is None:
                continue
            ok, level = await self.counters.take(scope, tokens, now)
            if not ok:
                for earlier in counted:  # what the scopes before took goes back
                    await self.counters.adjust(earlier.scope, -1, -tokens, now)
                raise self._refusal(scope, level, tokens, [*counted, Counted(scope, level)])
            counted.append(Counted(scope, level))
        return counted

    def _refusal(self, scope: Scope, level: Level, tokens: int, counted: list[Counted]) -> ProxyError:
        limits = scope.limits
        requests_full = limits.rpm_limit is not None and level.requests + 1 > limits.rpm_limit
        kind = "requests" if requests_full else "tokens"
        self.refused[kind] += 1
        headers = rate_headers(counted)
        if requests_full:
            limit, used, asked, unit = limits.rpm_limit, level.requests, 1, "requests per min (RPM)"
        else:
            limit, used, asked, unit = limits.tpm_limit, level.tokens, tokens, "tokens per min (TPM)"
        wait = wait_s(level, limits, tokens)
        if math.isinf(wait):
            headers["x-should-retry"] = "false"
            message = (f"Request too large for {_WHOSE[scope.kind]} on {unit}: Limit {limit}, Requested {asked}. "
                       "The input or output tokens must be reduced in order to run successfully.")
        else:
            headers.update(retry_headers(wait))
            message = (f"Rate limit reached for {_WHOSE[scope.kind]} on {unit}: Limit {limit}, Used "
                       f"{math.ceil(used)}, Requested {asked}. Please try again in {go_duration(wait)}.")
        return ProxyError(429, message, code="rate_limit_exceeded", error_type=kind, headers=headers)

    def run(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a counter update once a request settled) in the background."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class _Meter:
    """One request's use, settled once: by the credits stage (what it used), or given back unused."""

    def __init__(self, stage: RateLimits, quota: Quota, tokens: int) -> None:
        self.stage = stage
        self.quota = quota
        self.tokens = tokens
        self.done = False

    def settled(self, tokens: int, charged: int) -> None:
        if self.done:
            return
        self.done = True
        self.stage.run(self._settle(tokens, charged))

    def unused(self) -> None:
        if self.done:
            return
        self.done = True
        if self.tokens:
            self.stage.run(self._settle(0, 0))

    async def _settle(self, tokens: int, charged: int) -> None:
        counters, now = self.stage.counters, self.stage.clock()
        try:
            for scope in self.quota.scopes:
                if scope.limits.tpm_limit is not None and tokens != self.tokens:
                    await counters.adjust(scope, 0, tokens - self.tokens, now)
                if scope.limits.max_budget is not None and charged > 0:
                    await counters.spend(scope, budget_window(scope.limits.budget_duration, now), charged)
        except Exception:  # a counter that could not be updated must not fail the request already answered
            log.exception("rate limits and budgets not settled")
