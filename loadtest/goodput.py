"""Goodput at a TTFT objective: open-loop arrivals, per-run figures, and the rate a ratio is read at.

Pure (no I/O; randomness from a seeded :class:`random.Random`), so the load benchmark's arithmetic is tested
without a server.

* :func:`poisson_arrivals` — an open-loop schedule: a Poisson process of ``rate`` requests per second over a
  window of ``duration_s`` (each send time is fixed in advance; a slow answer never delays the next request).
* :func:`run_figures` — what one run at one rate gave: goodput (requests answered with a time to first token
  within the objective, per second of the arrival window), the share of requests that did so (attainment), TTFT
  p50/p99 of the answered ones, prompt-token reuse, and refusals apart (those at arrival and those after waiting
  counted apart too). A refusal (429 at the objective) is not goodput, nor is a late answer or an error: all three
  count in the denominator of attainment.
* :func:`ratio_rate` / :func:`goodput_ratio` — the figure a comparison reports: proxy goodput over direct goodput
  at the highest rate where the direct side still answers at least half the requests within the objective
  (beyond that rate the direct side is in overload, where any admission control wins by an arbitrary factor).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OK, REJECTED, LATE, ERROR = "ok", "rejected", "late", "error"
"""Outcomes of one request: answered; refused by the proxy (429); given up on by the client; failed otherwise."""

AT_ARRIVAL, AFTER_WAIT = "at_arrival", "after_wait"
"""Why the proxy refused a request (:attr:`Outcome.refused`): no replica was expected to start it within the
objective as it arrived; or it waited in a replica's queue until it could no longer start in time."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of a run: how it ended, its time to first token, and the server's report of its prompt."""

    status: str
    ttft_s: float
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    refused: str | None = None
    """A refusal's kind (:data:`AT_ARRIVAL`, :data:`AFTER_WAIT`), ``None`` when the 429 did not say."""


@dataclass(frozen=True, slots=True)
class RunFigures:
    rate: float
    """Offered rate, requests per second."""
    sent: int
    goodput_rps: float
    attainment: float
    """Share of the sent requests answered within the objective."""
    rejected: int
    rejected_at_arrival: int
    rejected_after_wait: int
    """Of ``rejected``: refused as they arrived; refused after waiting in a replica's queue (the rest, 429s that
    said neither, are other refusals)."""
    late: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    """Over the answered requests (``None`` when none was)."""
    reuse: float
    """``sum(cache_n) / sum(cache_n + prompt_n)`` over the answered requests (the server's own counts)."""
    prefill_share: float
    """``sum(prompt_ms) / sum(ttft)`` over the answered requests: the part of the time to first token the server
    spent computing the prompt (the rest: queueing, transfer, tokenisation, template, slot and cache handling)."""


def poisson_arrivals(rate: float, duration_s: float, rnd: random.Random) -> list[float]:
    """Send times (seconds from the start) of a Poisson process of ``rate`` per second within ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        return []
    times: list[float] = []
    now = rnd.expovariate(rate)
    while now < duration_s:
        times.append(now)
        now += rnd.expovariate(rate)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method (no interpolation: with few samples, p99 is the
    largest, not a value between the two largest)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run_figures(rate: float, duration_s: float, outcomes: Sequence[Outcome], slo_s: float) -> RunFigures:
    """The figures of one run of ``duration_s`` seconds of arrivals at ``rate``, against the objective ``slo_s``."""
    answered = [o for o in outcomes if o.status == OK]
    within = sum(1 for o in answered if o.ttft_s <= slo_s)
    ttfts = [o.ttft_s * 1000 for o in answered]
    cached = sum(o.cache_n for o in answered)
    computed = sum(o.prompt_n for o in answered)
    total_ttft_ms = sum(ttfts)
    return RunFigures(
        rate=rate,
        sent=len(outcomes),
        goodput_rps=within / duration_s if duration_s > 0 else 0.0,
        attainment=within / len(outcomes) if outcomes else 0.0,
        rejected=sum(1 for o in outcomes if o.status == REJECTED),
        rejected_at_arrival=sum(1 for o in outcomes if o.status == REJECTED and o.refused == AT_ARRIVAL),
        rejected_after_wait=sum(1 for o in outcomes if o.status == REJECTED and o.refused == AFTER_WAIT),
        late=sum(1 for o in outcomes if o.status == LATE),
        errors=sum(1 for o in outcomes if o.status == ERROR),
        ttft_p50_ms=percentile(ttfts, 0.5) if ttfts else None,
        ttft_p99_ms=percentile(ttfts, 0.99) if ttfts else None,
        reuse=cached / (cached + computed) if cached + computed else 0.0,
        prefill_share=sum(o.prompt_ms for o in answered) / total_ttft_ms if total_ttft_ms else 0.0,
    )


def ratio_rate(direct: Mapping[float, RunFigures], threshold: float = 0.5) -> float | None:
    """The highest offered rate at which the direct side answered at least ``threshold`` of the requests within
    the objective (``None`` when it never did)."""
    passing = [rate for rate, figures in direct.items() if figures.attainment >= threshold]
    return max(passing) if passing else None


def goodput_ratio(
    direct: Mapping[float, RunFigures], proxy: Mapping[float, RunFigures], threshold: float = 0.5
) -> tuple[float | None, float | None]:
    """``(rate, proxy goodput / direct goodput)`` at :func:`ratio_rate`; ``(None, None)`` when there is no such
    rate or the proxy side did not run at it."""
    rate = ratio_rate(direct, threshold)
    if rate is None or rate not in proxy:
        return None, None
    base = direct[rate].goodput_rps
    return rate, (proxy[rate].goodput_rps / base if base > 0 else None)
