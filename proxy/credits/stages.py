"""The credits stages of the pipeline: :class:`Credits` (reserve → settle) and its variants; who pays is on the
context already (:class:`proxy.auth.identify.Identify`).

``Credits`` settles what each request used; what it holds first depends on who answers. A request the caches
answer (a cache tier, a coalesced call) holds what that answer costs (its usage at its tier's price) just before it
is sent; one that goes upstream holds its worst case in the reserve stage (:class:`ReserveMiss`), placed after the
cache lookups, so a balance too low for a miss still gets a cached repeat. A balance that cannot cover the hold is
answered as OpenAI answers an exhausted quota (:func:`out_of_credit`: 429 ``insufficient_quota``, not to be
retried). Without a reserve stage (requests priced apart from any cache) the worst case is held up front. Then:

* a complete reply: from the ``usage`` (or llama.cpp ``timings``) of its JSON body, at once; the response
  carries ``X-Credits-Charged`` and ``X-Credits-Remaining``;
* a streamed reply: from the usage chunk, when the client has received everything (``Reply.on_finish``). The
  usage chunk is read on the way (:mod:`proxy.credits.streaming`); the stream_usage stage outside this one asked
  the upstream for it and hides it from a client that did not ask (:mod:`proxy.core.stream_usage`). Headers
  leave before the usage is known, so a stream carries ``X-Credits-Reserved`` and ``X-Credits-Remaining`` (what
  was left after the reservation) instead;
* a reply from a cache tier costs its usage times the hit multiplier it is priced under (``ctx.outcome``,
  :attr:`~proxy.core.outcome.Outcome.priced_as`: a semantic hit's is ``l2`` wherever its answer was held);
* reported usage is held to what the request allows (:meth:`~proxy.credits.pricing.PriceBook.bounded`:
  completion tokens at most ``max_tokens`` times the choices, prompt tokens at most the model's context), recorded with
  ``usage_source="capped"`` when it had to be;
* a reply with no usage the proxy can read is charged an estimate of what the upstream did: the prompt
  (:meth:`~proxy.credits.pricing.PriceBook.prompt_estimate`) and the completion it sent (its characters, or the
  relayed stream's tokens), recorded with ``usage_source="estimated"`` — never the whole reservation;
* a stream the client abandons (hangs up, or stops reading) is charged what the upstream produced: its usage when
  it arrived, else the prompt estimate plus the completion tokens relayed so far
  (:attr:`~proxy.credits.streaming.UsageMeter.relayed_completion_tokens`), recorded with
  ``usage_source="relayed"``; so is a request whose client hangs up before the answer started, once it went
  upstream (``ctx.upstream_called``): its prompt, and no completion. Before that, the reservation is released;
* an upstream error status, an exception or a stream the upstream broke off releases the whole reservation.

``X-Credits-Charged`` is what this request was charged: ``0`` for a released reservation, and for an answer
replayed for an ``Idempotency-Key`` (it was charged when first produced).

The ledger key of every call is the proxy's own id (32 random hex digits), sent back as ``X-Credits-Request-ID``;
a client's ``X-Request-ID`` is for tracing only and never decides whether or under which id a call is charged.
Retries that must not be charged twice carry an ``Idempotency-Key`` instead (:mod:`proxy.idempotency.stage`).

The runtime hands these stages a :class:`~proxy.credits.journaled_store.JournaledCreditStore`: while the
real store is down it admits requests on the outage allowance and journals their settlements durably on local
disk, replayed when the store is back. What still fails reaches the stage as
:class:`~proxy.stores.unavailable.StoreUnavailable`: a settlement that neither the store nor the journal took
is retried in memory (settling is idempotent by request id) for ``settle_retry_window_s``; a reservation whose
settlement is late is reaped and charged late (see :mod:`proxy.credits.store`). A reservation the store cannot
take and the allowance cannot cover is refused with 503 + ``Retry-After`` unless ``fail_open`` is set; then it
runs unbilled, counted in ``unbilled_requests`` and logged at most once per minute.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Protocol

from proxy.core.context import FinishCallback, Handoff, Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Named, Next
from proxy.core.usage import Usage, usage_from_body
from proxy.credits.pricing import CHARS_PER_TOKEN, PriceBook, format_credits
from proxy.credits.settings import CreditsSettings
from proxy.credits.store import ChargeDetails, CreditStore, InsufficientCredit, Reservation, Settlement
from proxy.credits.streaming import UsageMeter
from proxy.stores.unavailable import StoreUnavailable, store_unavailable

_CREDITS = CreditsSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.credits")

CHARGED = "X-Credits-Charged"
REMAINING = "X-Credits-Remaining"
RESERVED = "X-Credits-Reserved"
LEDGER_ID = "X-Credits-Request-ID"


OUT_OF_CREDIT = ("You exceeded your current quota: your balance is {balance} credits and this request may cost up to "
                 "{needed} credits. Top up your balance or lower max_tokens.")


def out_of_credit(short: InsufficientCredit) -> ProxyError:
    """The answer to a request the balance cannot cover: OpenAI's own answer to an exhausted quota (429, type and
    code ``insufficient_quota``), with ``x-should-retry: false`` and no ``Retry-After``, so the openai SDK does not
    retry it (it retries a 429 by default) and qdrant-client raises it at once."""
    balance, needed = format_credits(short.available), format_credits(short.needed)
    return ProxyError(429, OUT_OF_CREDIT.format(balance=balance, needed=needed), code="insufficient_quota",
                      error_type="insufficient_quota", headers={"x-should-retry": "false"})


async def _discard(reply: Reply) -> None:
    """Drop a reply that will not be sent: close its stream, run its finish callbacks as failed."""
    if reply.chunks is not None:
        aclose = getattr(reply.chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    await reply.finish(False, reply.body or b"")


class Metering(Protocol):
    """What the rate-limit stage is told once a request is settled (:data:`METERING`, given by rate_limits; told by
    credits): the tokens the upstream processed for it and the micro-credits it was charged."""

    def settled(self, tokens: int, charged: int) -> None: ...


RESERVATION: Handoff[Reservation] = Handoff("reservation")
"""The billing reservation held for a request (the upstream is then asked to report its usage)."""
METERING: Handoff[Metering] = Handoff("metering")
"""Told what a request used once it is settled, to settle its limits (given by rate_limits, which imports this
module: declared here, by its reader)."""


class Credits:
    """Reserve the worst case of an LLM request, settle its actual usage (see the module docstring)."""

    name = "credits"
    needs: frozenset[str] = frozenset()
    gives: frozenset[Named] = frozenset({RESERVATION, "charged"})
    reads_if_given: frozenset[Named] = frozenset({"outcome", METERING})
    """A hit is charged at its tier's multiplier; without a tier (``None``) the upstream answered. The rate_limits
    stage's meter, when there is one, is told what a settled request used."""
    response = False
    """The requests are Responses API requests (their output limit is ``max_output_tokens``)."""
    priced_by_body = True
    """The price is read from a JSON body: a request without one is not this stage's to bill."""

    def __init__(
        self,
        store: CreditStore,
        prices: PriceBook,
        *,
        reservation_ttl_s: float = _CREDITS.reservation_ttl_s,
        fail_open: bool = False,
        retry_after_s: int = 5,
        settle_retry_window_s: float = 3600.0,
        settling: set[asyncio.Task[None]] | None = None,
    ) -> None:
        """``settling``: settlements retried in the background (kept by the runtime, which waits for them at
        shutdown, so a rebuilt stage loses none)."""
        self.store = store
        self.prices = prices
        self.reservation_ttl_s = reservation_ttl_s
        self.fail_open = fail_open
        self.retry_after_s = retry_after_s
        self.settle_retry_window_s = settle_retry_window_s
        self.reserves_at_miss = False
        """A :class:`ReserveMiss` stage after the cache lookups reserves (see :meth:`at_miss`)."""
        self.unbilled_requests = 0
        self._last_unbilled_log = float("-inf")
        self._retries = settling if settling is not None else set()

    # -- what is priced (overridden for vector searches) --

    def estimate(self, ctx: RequestContext) -> int:
        """The reservation for this request, in micro-credits."""
        assert ctx.body is not None
        return self.prices.worst_case(ctx.body, raw_size=len(ctx.raw_body) or None, response=self.response)

    def estimated(self, ctx: RequestContext, completion_tokens: int) -> Usage:
        """What the upstream did by estimate, for a request whose usage it did not report: the prompt it was sent
        (the per-item caches send only the missing items), and ``completion_tokens``."""
        sent = ctx.outgoing_json() or {}
        return Usage(self.prices.prompt_estimate(sent, len(ctx.raw_body) or None), completion_tokens)

    def reported(self, ctx: RequestContext, body: bytes) -> Usage | None:
        """The usage a complete reply reports, ``None`` when it reports none the proxy can read."""
        return usage_from_body(body)

    def cost(self, ctx: RequestContext, usage: Usage, source: str = "reported") -> tuple[int, ChargeDetails]:
        """What the finished request costs, and what the ledger records about it (``source``: where ``usage``
        came from)."""
        model = ctx.body.get("model") if ctx.body else None
        model = model if isinstance(model, str) else ""
        tier = ctx.outcome.priced_as if ctx.outcome is not None else None
        bounded = self.prices.bounded(ctx.body or {}, usage, response=self.response)
        details = ChargeDetails(tenant=ctx.tenant, model=model, tier=tier or "upstream",
                                usage_source=source if bounded == usage else "capped",
                                prompt_tokens=bounded.prompt_tokens, completion_tokens=bounded.completion_tokens,
                                cached_tokens=bounded.cached_tokens)
        return self.prices.actual_cost(model, bounded, tier), details

    # -- the flow --

    def at_miss(self) -> ReserveMiss:
        """The stage that reserves a miss's worst case, placed after the cache lookups (just before the upstream):
        from then on this stage reserves nothing up front, and an answer served without the upstream is charged
        only what it costs."""
        self.reserves_at_miss = True
        return ReserveMiss(self)

    async def reserve(self, ctx: RequestContext) -> None:
        """Hold the worst case of the upstream call ``ctx`` is about to make (:data:`RESERVATION`); refuse it when
        the balance cannot cover it; run it unbilled when the store is down and ``fail_open`` is set."""
        await self._hold(ctx, self.estimate(ctx))

    async def _hold(self, ctx: RequestContext, amount: int) -> Reservation | None:
        try:  # the ledger key is the proxy's own id, never the client's (see the module docstring)
            reservation = await self.store.reserve(uuid.uuid4().hex, ctx.user, amount, self.reservation_ttl_s)
        except StoreUnavailable as exc:
            if not self.fail_open:
                raise store_unavailable("the credit store", self.retry_after_s) from exc
            self._count_unbilled(exc)
            return None
        if isinstance(reservation, InsufficientCredit):
            raise out_of_credit(reservation)
        ctx.handoffs[RESERVATION] = reservation
        ctx.response_headers[LEDGER_ID] = reservation.request_id
        return reservation

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.body is None and self.priced_by_body:
            return await call_next(ctx)
        if not self.reserves_at_miss:
            await self.reserve(ctx)
            if ctx.handoffs.get(RESERVATION) is None:  # unbilled (fail_open)
                return await call_next(ctx)
        try:
            reply = await call_next(ctx)
        except asyncio.CancelledError:  # the client hung up before the answer started
            held = ctx.handoffs.get(RESERVATION)
            if held is not None:
                if ctx.upstream_called:  # the upstream has the prompt: that much it did
                    await asyncio.shield(self._settle(ctx, held, self.estimated(ctx, 0), "relayed"))
                else:
                    await self._release(held)
            raise
        except BaseException:
            held = ctx.handoffs.get(RESERVATION)
            if held is not None:
                await self._release(held)
            raise
        reservation = ctx.handoffs.get(RESERVATION)
        if reservation is None:
            if not 200 <= reply.status < 300 or ctx.upstream_called:
                return reply  # refused before the upstream, or the upstream answered unbilled (fail_open)
            served = self._served_usage(ctx, reply)
            reservation = await self._hold_served(ctx, reply, served)
            if reservation is None:
                return reply
        else:
            served = None
        if not 200 <= reply.status < 300:
            await self._release(reservation)
            self._charged(ctx, 0)
            return reply
        if reply.chunks is not None and self.priced_by_body:
            meter = UsageMeter()
            reply.chunks = meter.filter(reply.chunks)
            reply.on_finish(self._settle_stream(ctx, reservation, meter, served))
            ctx.response_headers[RESERVED] = format_credits(reservation.amount)
            ctx.response_headers[REMAINING] = format_credits(reservation.available_after)
            return reply
        body = reply.body or b""
        usage = served or self.reported(ctx, body)
        if usage is None:
            settlement = await self._settle(ctx, reservation, self.estimated(ctx, -(-len(body) // CHARS_PER_TOKEN)),
                                            "estimated")
        else:
            settlement = await self._settle(ctx, reservation, usage)
        if settlement is not None:
            self._charged(ctx, settlement.charged)
            ctx.response_headers[REMAINING] = format_credits(settlement.available)
        return reply

    def _served_usage(self, ctx: RequestContext, reply: Reply) -> Usage | None:
        """The usage of an answer served without the upstream (a cache tier's, a coalesced call's): reported in
        its body or its cached entry, else estimated from them; ``None`` for a stream not known yet (a follower of
        a streaming call still running)."""
        body = reply.body if reply.body is not None else ctx.entry.body if ctx.entry is not None else None
        if body is None:
            return None
        usage = self.reported(ctx, body) if reply.body is not None else usage_from_body(body)
        return usage or self.estimated(ctx, -(-len(body) // CHARS_PER_TOKEN))

    async def _hold_served(self, ctx: RequestContext, reply: Reply, usage: Usage | None) -> Reservation | None:
        """Hold what an answer served without the upstream costs (its usage at its tier's price; the worst case for
        a stream not known yet) before it is sent; refused, the answer is dropped unsent."""
        amount = self.cost(ctx, usage)[0] if usage is not None else self.estimate(ctx)
        try:
            return await self._hold(ctx, amount)
        except ProxyError:
            await _discard(reply)
            raise

    @staticmethod
    def _charged(ctx: RequestContext, micro: int) -> None:
        """What this request was charged, settled with the reply: on the context (read by the metrics as a number)
        and in ``X-Credits-Charged``."""
        ctx.charged = micro
        ctx.response_headers[CHARGED] = format_credits(micro)

    def _settle_stream(self, ctx: RequestContext, reservation: Reservation, meter: UsageMeter,
                       served: Usage | None) -> FinishCallback:
        """``served``: the usage of a cached answer being replayed (what it costs once complete)."""
        async def settle(reply: Reply, ok: bool, body: bytes) -> None:
            if ok and served is not None:
                await self._settle(ctx, reservation, served)
            elif meter.usage is not None:
                await self._settle(ctx, reservation, meter.usage)
            elif ok:  # complete, but the upstream reported no usage
                await self._settle(ctx, reservation, self.estimated(ctx, meter.relayed_completion_tokens),
                                   "estimated")
            elif meter.upstream_broke:
                await self._release(reservation)
            else:  # the client went away: what the upstream produced until then is billed
                await self._settle(ctx, reservation, self.estimated(ctx, meter.relayed_completion_tokens), "relayed")

        return settle

    async def _settle(self, ctx: RequestContext, reservation: Reservation, usage: Usage,
                      source: str = "reported") -> Settlement | None:
        actual, details = self.cost(ctx, usage, source)
        metering = ctx.handoffs.get(METERING)
        if metering is not None:  # rate limits: the tokens the upstream processed (none for a hit), the charge
            upstream = details.tier == "upstream"
            metering.settled(details.prompt_tokens + details.completion_tokens if upstream else 0, actual)
        try:
            return await self.store.settle(reservation.request_id, reservation.user, actual, details)
        except StoreUnavailable as exc:
            log.warning("settling %s failed, retrying in memory: %s", reservation.request_id, exc)
            task = asyncio.create_task(self._settle_later(reservation, actual, details))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)
            return None

    async def _settle_later(self, reservation: Reservation, actual: int, details: ChargeDetails) -> None:
        deadline = time.monotonic() + self.settle_retry_window_s
        pause = 0.5
        while True:
            await asyncio.sleep(pause)
            try:
                await self.store.settle(reservation.request_id, reservation.user, actual, details)
                return
            except StoreUnavailable as exc:
                if time.monotonic() + pause > deadline:
                    log.error(
                        "could not settle %s for %s (%d µcr, %s): %s",
                        reservation.request_id,
                        reservation.user,
                        actual,
                        details,
                        exc,
                    )
                    return
            pause = min(pause * 2, 60.0)

    async def _release(self, reservation: Reservation) -> None:
        """Give the whole reservation back (shielded: it completes even if the request is being cancelled).

        A failure is logged; the reaper returns the hold after its TTL.
        """
        try:
            await asyncio.shield(self.store.release(reservation.request_id, reservation.user))
        except StoreUnavailable as exc:
            log.warning("releasing %s failed (reaped after its TTL): %s", reservation.request_id, exc)

    def _count_unbilled(self, exc: Exception) -> None:
        self.unbilled_requests += 1
        now = time.monotonic()
        if now - self._last_unbilled_log >= 60.0:
            self._last_unbilled_log = now
            log.error(
                "credit store unavailable, serving unbilled (fail_open; %d so far): %s",
                self.unbilled_requests,
                exc,
            )

class ReserveMiss:
    """Reserve the worst case of a request that goes upstream, once the caches could not answer it (the settling
    is its :class:`Credits` stage's, outside the lookups)."""

    name = "reserve"
    needs: frozenset[str] = frozenset()
    gives = frozenset({RESERVATION})

    def __init__(self, credits: Credits) -> None:
        self.credits = credits

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.handoffs.get(RESERVATION) is None and (ctx.body is not None or not self.credits.priced_by_body):
            await self.credits.reserve(ctx)
        return await call_next(ctx)


class SearchCredits(Credits):
    """Credits for vector searches: a fixed price per search (each search of a batch), discounted on a hit."""

    name = "credits"

    def _searches(self, ctx: RequestContext) -> int:
        """The searches sent upstream: on a partial hit of the retrieval cache, the missing ones only."""
        sent = ctx.outgoing_json()
        searches = sent.get("searches") if sent else None
        return len(searches) if isinstance(searches, list) and searches else 1

    def estimate(self, ctx: RequestContext) -> int:
        return self.prices.search_cost(self._searches(ctx))

    def cost(self, ctx: RequestContext, usage: Usage, source: str = "reported") -> tuple[int, ChargeDetails]:
        tier = ctx.outcome.priced_as if ctx.outcome is not None else None
        details = ChargeDetails(
            tenant=ctx.tenant, model="vector-search", tier=tier or "upstream", usage_source="searches"
        )
        return self.prices.search_cost(self._searches(ctx), tier), details


class RequestCredits(Credits):
    """Credits for a forwarded request that has no price of its own (an operator-allowed LLM pass-through, a Qdrant
    request other than a search): ``credits.request_price`` each, whatever the body and the answer (a streamed
    answer is settled before it is relayed)."""

    name = "credits"
    priced_by_body = False

    def estimate(self, ctx: RequestContext) -> int:
        return self.prices.request_cost()

    def reported(self, ctx: RequestContext, body: bytes) -> Usage | None:
        return Usage(0, 0)

    def estimated(self, ctx: RequestContext, completion_tokens: int) -> Usage:
        return Usage(0, 0)

    def cost(self, ctx: RequestContext, usage: Usage, source: str = "reported") -> tuple[int, ChargeDetails]:
        details = ChargeDetails(tenant=ctx.tenant, model="request", tier="upstream", usage_source="request")
        return self.prices.request_cost(), details
