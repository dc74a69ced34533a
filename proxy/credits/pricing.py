"""Credit pricing: the most a request may cost (its reservation) and what it did cost (its settlement). Pure.

Units. Prices are configured in credits as :class:`~decimal.Decimal` (``"0.5"`` per 1k tokens); everything
that reaches a store or the ledger is an ``int`` of **micro-credits** (1 credit = 1,000,000 µcr). Integers add
and subtract exactly in SQLite (64-bit INTEGER), in Redis (``HINCRBY``, and Lua numbers are exact to 2**53 µcr
≈ 9·10**9 credits) and in Python, so a ledger of millions of entries never drifts the way floats do. Each
request's cost is computed exactly in Decimal and rounded once, upwards (``ROUND_CEILING``) to a whole
micro-credit.

Worst case (reserved before forwarding):

* prompt tokens ≤ the UTF-8 size of the JSON request body divided by ``prompt_bytes_per_token``. With the
  default of 1 this is a true upper bound for byte-level BPE and byte-fallback SentencePiece tokenizers (every
  token covers at least one byte of text, and the JSON keys and quotes around each message outweigh the chat
  template's special tokens); images sent as base64 are over-counted, never under-counted. A value of 4 gives
  the usual English average instead: smaller reservations, and a settlement that then draws any excess from
  the free balance (never below 0). The bound is capped at the model's context size.
* completion tokens = ``max_completion_tokens`` or ``max_tokens`` when given (a Responses API request:
  ``max_output_tokens``), else the model's completion limit (itself at most its context size), times
  ``max(n, best_of)``. Embedding requests (``input`` without ``messages`` or ``prompt``, unless the caller says
  the body is a Responses request) produce no completion tokens.
* priced at the higher of the prompt and cached-prompt rates, with no hit discount.

Actual cost: uncached prompt tokens at the prompt rate, cached prompt tokens at the cached rate, completion
tokens at the completion rate; a reply served from a cache tier costs that amount times the tier's hit
multiplier. Reported usage is first held to what the request allows (:meth:`PriceBook.bounded`): completion tokens
at most the request's completion bound (``max_tokens`` times the choices), prompt tokens at most the model's
context — an upstream that reports more is not believed past what it could have done.

Estimates, where the upstream reported nothing (an answer without usage, a client gone before the usage came):
``CHARS_PER_TOKEN`` characters of text per token, the usual English average — of the prompt's strings
(:meth:`PriceBook.prompt_estimate`, at most the prompt bound) and of the completion produced. Never the worst case.

Rerankers are priced per document scored (``rerank_price``, each query-document pair of a score request): the
worst case is every document of the request, the actual cost counts the documents the upstream scored at the full
price and those answered from the cache at the cache tier's hit multiplier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

import orjson

from proxy.core.outcome import MICRO
from proxy.core.usage import Usage
from proxy.credits.settings import CreditsSettings, ModelPriceSettings

CHARS_PER_TOKEN = 4
"""Characters of text per token, the usual English average: the estimate of what the upstream did not report."""

_PROMPT_FIELDS = ("messages", "prompt", "input", "instructions", "tools", "functions", "system")
"""Where a request's prompt text is (chat, completions, Responses, embeddings)."""

_THOUSAND = Decimal(1000)


def to_micro(credits: Decimal | int | str) -> int:
    """``credits`` as whole micro-credits, rounded up."""
    return int((Decimal(credits) * MICRO).to_integral_value(rounding=ROUND_CEILING))


def format_credits(micro: int) -> str:
    """Micro-credits as a plain number of credits (``1500000`` → ``"1.5"``), for headers and messages."""
    text = format(Decimal(micro) / MICRO, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """Credits per 1,000 tokens of one model."""

    prompt_per_1k: Decimal
    completion_per_1k: Decimal
    cached_prompt_per_1k: Decimal | None = None
    """Rate for prompt tokens the backend reports as cached; ``None`` = the prompt rate."""

    @property
    def cached_rate(self) -> Decimal:
        return self.prompt_per_1k if self.cached_prompt_per_1k is None else self.cached_prompt_per_1k

    def cost(self, usage: Usage) -> Decimal:
        """Exact cost of ``usage`` in credits (no rounding, no discount)."""
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        return (
            (usage.prompt_tokens - cached) * self.prompt_per_1k
            + cached * self.cached_rate
            + usage.completion_tokens * self.completion_per_1k
        ) / _THOUSAND


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Token limits of one model, for the worst case when the request sets no ``max_tokens``."""

    context_tokens: int = ModelPriceSettings.model_fields["context_tokens"].default
    max_completion_tokens: int | None = None
    """``None`` = the context size."""

    @property
    def completion_cap(self) -> int:
        cap = self.max_completion_tokens
        return self.context_tokens if cap is None else min(cap, self.context_tokens)


_DEFAULTS = CreditsSettings()
"""The settings' defaults: a price book built without overrides charges what an unconfigured proxy charges."""


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Every price the proxy charges, and the limits it needs to bound a request's cost."""

    models: Mapping[str, ModelPrice] = field(default_factory=dict)
    default_price: ModelPrice = ModelPrice(_DEFAULTS.default_prompt_per_1k, _DEFAULTS.default_completion_per_1k)
    """Price of a model absent from ``models``."""
    limits: Mapping[str, ModelLimits] = field(default_factory=dict)
    default_limits: ModelLimits = ModelLimits()
    search_price: Decimal = _DEFAULTS.search_price
    """Credits per vector search (each search of a batch counts)."""
    rerank_price: Decimal = _DEFAULTS.rerank_price
    """Credits per document a reranker scores."""
    request_price: Decimal = _DEFAULTS.request_price
    """Credits per forwarded request that has no price of its own (allowed pass-through, Qdrant other than search)."""
    hit_multipliers: Mapping[str, Decimal] = field(default_factory=lambda: dict(_DEFAULTS.hit_multipliers))
    default_hit_multiplier: Decimal = _DEFAULTS.default_hit_multiplier
    """Multiplier of a tier absent from ``hit_multipliers``."""
    prompt_bytes_per_token: Decimal = Decimal(1)

    def price_of(self, model: str | None) -> ModelPrice:
        return self.models.get(model or "", self.default_price)

    def limits_of(self, model: str | None) -> ModelLimits:
        return self.limits.get(model or "", self.default_limits)

    def hit_multiplier(self, tier: str | None) -> Decimal:
        """1 for a reply that came from upstream (``tier`` is ``None``), else the tier's multiplier."""
        if tier is None:
            return Decimal(1)
        return self.hit_multipliers.get(tier.lower(), self.default_hit_multiplier)

    def worst_case(self, body: Mapping[str, Any], raw_size: int | None = None, *, response: bool = False) -> int:
        """The most a request with this JSON ``body`` may cost in µcr (``raw_size``: its wire size; ``response``:
        the body is a Responses API request)."""
        model = body.get("model")
        model = model if isinstance(model, str) else None
        limits = self.limits_of(model)
        prompt = self.prompt_bound(body, raw_size)
        completion = _completion_bound(body, limits, response)
        price = self.price_of(model)
        rate = max(price.prompt_per_1k, price.cached_rate)
        exact = (prompt * rate + completion * price.completion_per_1k) / _THOUSAND
        return to_micro(exact)

    def prompt_bound(self, body: Mapping[str, Any], raw_size: int | None = None) -> int:
        """The most prompt tokens a request with this JSON ``body`` can have (see the module docstring)."""
        model = body.get("model")
        size = raw_size if raw_size is not None else len(orjson.dumps(body))
        prompt = int((Decimal(size) / self.prompt_bytes_per_token).to_integral_value(rounding=ROUND_CEILING))
        return min(prompt, self.limits_of(model if isinstance(model, str) else None).context_tokens)

    def prompt_estimate(self, body: Mapping[str, Any], raw_size: int | None = None) -> int:
        """Estimated prompt tokens of a request: the characters of every string in its prompt fields over
        ``CHARS_PER_TOKEN`` (at least 1), at most :meth:`prompt_bound`."""
        chars = 0
        pending: list[Any] = [body.get(name) for name in _PROMPT_FIELDS]
        while pending:
            value = pending.pop()
            if isinstance(value, str):
                chars += len(value)
            elif isinstance(value, dict):
                pending.extend(value.values())
            elif isinstance(value, list):
                pending.extend(value)
        return min(max(1, -(-chars // CHARS_PER_TOKEN)), self.prompt_bound(body, raw_size))

    def bounded(self, body: Mapping[str, Any], usage: Usage, *, response: bool = False) -> Usage:
        """``usage`` held to what the request allows (see the module docstring; ``response``: a Responses API
        request)."""
        model = body.get("model")
        limits = self.limits_of(model if isinstance(model, str) else None)
        prompt = min(usage.prompt_tokens, limits.context_tokens)
        completion = min(usage.completion_tokens, _completion_bound(body, limits, response))
        if (prompt, completion) == (usage.prompt_tokens, usage.completion_tokens):
            return usage
        return Usage(prompt, completion, min(usage.cached_tokens, prompt))

    def actual_cost(self, model: str | None, usage: Usage, tier: str | None = None) -> int:
        """What the reply costs in µcr: usage at the model's rates, times the hit multiplier of ``tier``."""
        return to_micro(self.price_of(model).cost(usage) * self.hit_multiplier(tier))

    def search_cost(self, searches: int = 1, tier: str | None = None) -> int:
        """µcr of ``searches`` vector searches (``tier="retrieval"`` when the retrieval cache answered)."""
        return to_micro(self.search_price * searches * self.hit_multiplier(tier))

    def request_cost(self) -> int:
        """µcr of one forwarded request that has no price of its own."""
        return to_micro(self.request_price)

    def rerank_cost(self, scored: int, cached: int = 0, tier: str | None = None) -> int:
        """µcr of a rerank: ``scored`` documents scored upstream, ``cached`` ones answered by cache ``tier``."""
        return to_micro(self.rerank_price * (scored + cached * self.hit_multiplier(tier)))


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _completion_bound(body: Mapping[str, Any], limits: ModelLimits, response: bool) -> int:
    if response:
        requested = _positive_int(body.get("max_output_tokens"))
    elif "input" in body and "messages" not in body and "prompt" not in body:
        return 0  # an embedding request
    else:
        requested = _positive_int(body.get("max_completion_tokens"))
        if requested is None:
            requested = _positive_int(body.get("max_tokens"))
    per_choice = limits.completion_cap if requested is None else min(requested, limits.completion_cap)
    choices = max(_positive_int(body.get("n")) or 1, _positive_int(body.get("best_of")) or 1)
    return per_choice * choices
