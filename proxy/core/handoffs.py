"""The values stages hand on to later stages through the request context's slots.

Apart from the stages that build them so that :class:`~proxy.core.context.RequestContext` can name every slot's type
without importing a stage (every stage imports the context): the context and the stages both import this module,
and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.trace import Span

from proxy.kv.order import OrderPolicy
from proxy.kv.plan import PromptPlan
from proxy.kv.router import FirstToken
from proxy.kv.tree import Match, Segment
from tiers.embedders.base import FloatArray
from tiers.semantic import SemanticScope


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


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class ReplicaOrder:
    replica: int
    order: tuple[Segment, ...]
    cached_tokens: int


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class ShapedRequest:
    """What :class:`~proxy.kv.stages.Shape` decided (``ctx.shape``): the prompt's plan, the order policy, and each
    replica's order."""

    plan: PromptPlan
    policy: OrderPolicy
    orders: list[ReplicaOrder]
    """One per replica, in index order."""


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class RoutedRequest:
    """What :meth:`proxy.kv.stages.Route.route` decided (``ctx.routed``)."""

    replica: int
    path: tuple[Segment, ...]
    predicted: Match
    slot: int | None
    estimated_ttft_s: float
    start_deadline: float | None = None
    """Latest start (router clock) that still meets the TTFT objective; the queue drops the request after it."""
    total_tokens: int = 0
    """The prompt's estimated length (the tree's unit)."""
    slot_match: Match | None = None
    """The part of the path the chosen llama.cpp slot holds, where that is all the server can reuse (no prompt
    cache, or a slot it reuses as it is without restoring from its cache, :class:`~proxy.kv.hints.SlotTable`), and
    what its report is compared with (another slot lacking a prefix says nothing about the tree)."""
    shifted: bool = False
    """The backend was allowed to reuse chunks outside the common prefix (``shift`` policy): its report then
    counts more than the prefix, so it can show a shortfall but not a surplus."""
    headers: dict[str, str] | None = None
    """Hint headers for the upstream request."""
    ticket: str = ""
    """The router's name for this request while it is in flight: the proxy's own, unique among requests in flight
    (a client's ``X-Request-ID`` is not: clients reuse them)."""
    first_token: FirstToken | None = None
    """What the router knew of it at its first token (:meth:`~proxy.kv.router.Router.first_token`): whether its
    prefill ran alone on the replica (only then does the reported prefill time go to the prefill model), and the
    inputs of the slowdown (``None`` when the router tracks no load)."""


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The request's span (``ctx.trace``) and the context its stage spans (and the forwarded ``traceparent``)
    descend from."""

    span: Span
    context: Context
