"""The values stages hand on to later stages through the request context's slots.

Apart from the stages that build them so that :class:`~proxy.core.context.RequestContext` can name every slot's type
without importing a stage (every stage imports the context): the context and the stages both import this module,
and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.trace import Span

from tiers.embedders.base import FloatArray
from tiers.semantic import SemanticScope


@dataclass(frozen=True, slots=True)
class Reservation:
    """The credits held for one request (``ctx.reservation``, set by :class:`proxy.credits.stages.Credits`)."""

    request_id: str
    user: str
    amount: int
    expires_at: float
    available_after: int
    """What the account had left to reserve right after this hold."""


@dataclass(frozen=True, slots=True)
class RerankCount:
    """Documents of one reranker request: scored upstream, and answered from the cache (``ctx.rerank``); ``tokens``:
    what the answer's usage reports (the credits stage records it without parsing the answer again)."""

    scored: int
    cached: int
    tokens: int = 0


@dataclass(slots=True)
class SemanticQuery:
    """A question the L2 stage looked up (``ctx.semantic``): where, under which context signature, and its embedding
    once computed (stored entries carry the question, the cold tier the vector)."""

    question: str
    """As compared (the template's lines left out)."""
    where: SemanticScope
    digest: str
    tag: str
    vector: FloatArray | None = None
    asked: str | None = None
    """As asked, when that differs from ``question``."""
    instructions: str = ""
    """What else the request tells the model (system prompt, earlier turns; documents cut out)."""


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The request's span (``ctx.trace``) and the context its stage spans (and the forwarded ``traceparent``)
    descend from."""

    span: Span
    context: Context


@dataclass(frozen=True, slots=True)
class Limits:
    """What one key, user or tenant may use (set through the admin API; :mod:`proxy.rate_limits.decisions`);
    ``None``: no limit of that kind."""

    rpm_limit: int | None = None
    """Requests per minute."""
    tpm_limit: int | None = None
    """Tokens per minute (prompt and completion tokens the upstream processed)."""
    max_budget: int | None = None
    """Micro-credits that may be charged per ``budget_duration`` (in all, without one)."""
    budget_duration: str | None = None
    """The budget's period: ``<n>s``, ``<n>m``, ``<n>h``, ``<n>d`` or ``<n>mo`` (fixed windows, UTC)."""

    @property
    def limited(self) -> bool:
        return self.rpm_limit is not None or self.tpm_limit is not None or self.max_budget is not None


NO_LIMITS = Limits()
"""Limits that limit nothing."""


@dataclass(frozen=True, slots=True)
class Scope:
    """A key, user or tenant and its limits: ``kind`` is ``key``, ``user`` or ``tenant``."""

    kind: str
    name: str
    limits: Limits

    @property
    def id(self) -> str:
        """``<kind>:<name>``: what its counters are kept under."""
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True, slots=True)
class Quota:
    """The limited scopes a request runs under (``ctx.quota``, set by identify): its key's, its user's, its tenant's,
    those with a limit only."""

    scopes: tuple[Scope, ...]


class Metering(Protocol):
    """What the rate-limit stage is told once a request is settled (``ctx.metering``, set by rate_limits; told by
    credits): the tokens the upstream processed for it and the micro-credits it was charged."""

    def settled(self, tokens: int, charged: int) -> None: ...
