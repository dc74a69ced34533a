"""The request limits of :mod:`normalizer.limits`, applied before anything else reads a request's body."""

from __future__ import annotations

from normalizer.limits import RequestLimits, Shape, check_llm, check_search
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Next


class EnforceLimits:
    """Refuse a body deeper, larger or shaped otherwise than the limits allow (400/413 in the route's shape):
    a Qdrant search's (``search``), or one of an endpoint of the given ``shape`` (its row's)."""

    name = "limits"
    needs: frozenset[str] = frozenset()
    gives: frozenset[str] = frozenset()

    def __init__(self, limits: RequestLimits, *, search: bool = False, shape: Shape | None = None) -> None:
        self.limits = limits
        self.search = search
        self.shape = shape

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.body is not None:
            if self.search:
                exceeded = check_search(ctx.request.path.endswith("/batch"), ctx.body, ctx.raw_body, self.limits)
            else:
                exceeded = check_llm(ctx.body, ctx.raw_body, self.limits, self.shape)
            if exceeded is not None:
                raise ProxyError(exceeded.status, exceeded.message, code=exceeded.code)
        return await call_next(ctx)
