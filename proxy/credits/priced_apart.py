"""Credit stages of the endpoints priced unlike chat: the Responses API (its output limit is ``max_output_tokens``)
and rerankers (a price per document, :meth:`~proxy.credits.pricing.PriceBook.rerank_cost`). Reserving, settling and
releasing are :class:`~proxy.credits.stages.Credits`'s; only what is priced differs."""

from __future__ import annotations

from normalizer.rerank import document_count
from proxy.core.context import RequestContext
from proxy.core.errors import ProxyError
from proxy.core.usage import Usage
from proxy.credits.stages import Credits
from proxy.credits.store import ChargeDetails
from proxy.items.rerank import RERANK


class ResponseCredits(Credits):
    """Credits for ``/v1/responses`` (and ``/v1/responses/compact``): the worst case, and what the usage may be,
    bound the output by ``max_output_tokens``.

    ``background: true`` is refused (400): the upstream answers with a queued object and does the work later,
    unobserved; its usage comes back only through a later ``GET`` the client may never make, so the work could be
    billed neither when it is done nor exactly once."""

    response = True

    def estimate(self, ctx: RequestContext) -> int:
        if (ctx.body or {}).get("background"):
            raise ProxyError(400, "`background` is not supported through this proxy: a background response runs "
                             "upstream after the request is answered, where its usage cannot be billed; send the "
                             "request without it (stream it instead)", code="unsupported_parameter",
                             param="background", error_type="invalid_request_error")
        return super().estimate(ctx)


class RerankCredits(Credits):
    """Credits for rerankers: every document reserved; settled per document scored upstream, and per document
    answered from the cache at that tier's hit multiplier. Usage reported in tokens is recorded, not priced, and
    only where the per-document cache read the answer (:data:`~proxy.items.rerank.RERANK`): the answer is never
    parsed for it alone, as parsing an answer of 100,000 documents (about 14 MB) would hold the event loop for
    100-250 ms."""

    reads_if_given = Credits.reads_if_given | {RERANK}

    def estimate(self, ctx: RequestContext) -> int:
        return self.prices.rerank_cost(document_count(ctx.body or {}))

    def reported(self, ctx: RequestContext, body: bytes) -> Usage | None:
        counted = ctx.handoffs.get(RERANK)
        return None if counted is None else Usage(counted.tokens, 0)

    def cost(self, ctx: RequestContext, usage: Usage, source: str = "reported") -> tuple[int, ChargeDetails]:
        model = (ctx.body or {}).get("model")
        tier = ctx.outcome.priced_as if ctx.outcome is not None else None
        counted = ctx.handoffs.get(RERANK)  # None when the request bypassed the cache: every document went upstream
        scored, cached = (counted.scored, counted.cached) if counted else (document_count(ctx.body or {}), 0)
        details = ChargeDetails(tenant=ctx.tenant, model=model if isinstance(model, str) else "",
                                tier=tier or "upstream", usage_source="documents",
                                prompt_tokens=usage.prompt_tokens if source == "reported" else 0)
        return self.prices.rerank_cost(scored, cached, tier), details
