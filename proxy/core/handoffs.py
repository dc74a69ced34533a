"""The values stages hand on to later stages through the request context's slots.

Apart from the stages that build them so that :class:`~proxy.core.context.RequestContext` can name every slot's type
without importing a stage (every stage imports the context): the context and the stages both import this module,
and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    where: SemanticScope
    digest: str
    tag: str
    vector: FloatArray | None = None


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The request's span (``ctx.trace``) and the context its stage spans (and the forwarded ``traceparent``)
    descend from."""

    span: Span
    context: Context
