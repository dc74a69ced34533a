"""What the KV stages decide for a request and hand on to later stages: their :class:`~proxy.core.context.Handoff`
key (:data:`SHAPED`) and the values' types.

What route decides (:class:`RoutedRequest`) is given under the forward stage's key,
:data:`proxy.upstream.forward.DESTINATION`: forward reads it (the replica, the hint headers) and ranks below the
features, so it declares the key; the store and the KV benches read it too, the benches as a ``RoutedRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass

from normalizer.prompt_plan import PromptPlan, Segment
from proxy.core.context import Handoff
from proxy.kv.order import OrderPolicy
from proxy.kv.router import FirstToken
from proxy.kv.tree import Match


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class ReplicaOrder:
    replica: int
    order: tuple[Segment, ...]
    cached_tokens: int


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class ShapedRequest:
    """What :class:`~proxy.kv.stages.Shape` decided (:data:`SHAPED`): the prompt's plan, the order policy, and each
    replica's order."""

    plan: PromptPlan
    policy: OrderPolicy
    orders: list[ReplicaOrder]
    """One per replica, in index order."""


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class RoutedRequest:
    """What :meth:`proxy.kv.stages.Route.route` decided (:data:`~proxy.upstream.forward.DESTINATION`)."""

    replica: int
    path: tuple[Segment, ...]
    predicted: Match
    slot: int | None
    estimated_ttft_s: float
    start_deadline: float | None = None
    """Latest start (router clock) that still meets the TTFT objective; the queue drops the request after it."""
    total_tokens: int = 0
    """The prompt's estimated length (the tree's unit)."""
    expected: Match | None = None
    """What the server is expected to reuse, judged as the request starts (:meth:`proxy.kv.stages.Route.start`:
    what the slot table says the server reuses in the chosen llama.cpp slot, within the tree's match then), and
    what its report is compared with; ``None``: ``predicted``, made at routing time."""
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


SHAPED: Handoff[ShapedRequest] = Handoff("shape")
"""Given by :class:`~proxy.kv.stages.Shape`; read by route and by the store (the documents in the order sent)."""
