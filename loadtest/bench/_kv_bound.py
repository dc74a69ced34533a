"""The kv benchmarks' prefill bound in time: how much faster a peer's prefill would be with the ceiling's reuse,
by the servers' own timings (:func:`prefill_bound`).

The token share (``prefix_token_reuse_ceiling`` against a side's ``prefix_token_reuse``) counts every prompt token
alike. Prefill time does not: each request pays a fixed part, and a token's cost grows with the context before it
(attention), so the tokens a prefix cache reuses — the early ones — are the cheap ones, and the ratio of tokens
computed overstates what reuse can buy. This bound prices each request's split with the product's own prefill
model (:class:`proxy.kv.prefill.PrefillModel`), fitted to the run's ``timings`` (``prompt_n``, ``cache_n``,
``prompt_ms``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadtest.goodput import OK, Outcome
from proxy.kv.prefill import PrefillCoefficients, PrefillModel

MIN_FIT_ROWS = 8
"""Timing rows needed to fit the three coefficients (the proxy's own ``min_observations``); fewer: no time bound."""


@dataclass(frozen=True, slots=True)
class PrefillBound:
    """A peer's prefill against the ceiling's reuse over the same requests: ``time`` (modelled seconds, ``None``
    without a fit), ``tokens`` (tokens computed; ``None`` without requests), the ``requests`` counted, the
    ``fit_rows`` the model was fitted on and its ``coefficients``."""

    peer: str
    time: float | None
    tokens: float | None
    requests: int
    fit_rows: int
    coefficients: PrefillCoefficients | None

    def fields(self) -> dict[str, object]:
        """The benchmarks' JSON fields."""
        c = self.coefficients
        return {
            "prefill_bound_time": None if self.time is None else round(self.time, 3),
            "prefill_bound_tokens": None if self.tokens is None else round(self.tokens, 3),
            "prefill_bound_peer": self.peer,
            "prefill_bound_fit": {
                "rows": self.fit_rows, "requests": self.requests,
                **({"fixed_ms": round(c.fixed_s * 1000, 3), "per_token_ms": round(c.per_token_s * 1000, 5),
                    "per_token_context_ms": round(c.per_token_context_s * 1000, 6)} if c else {}),
            },
        }

    def describe(self) -> str:
        """One printed line."""
        time = "no fit" if self.time is None else f"{self.time:.2f}"
        if self.time is None:
            time += f" ({self.fit_rows} timing rows; {MIN_FIT_ROWS} needed, with three distinct splits)"
        tokens = "-" if self.tokens is None else f"{self.tokens:.2f}"
        return (f"{self.peer}'s prefill over the ceiling's, {self.requests} requests: in time {time}, in tokens "
                f"computed {tokens} (the servers' timings, fitted as the proxy's prefill model)")


def peer_side(sides: Iterable[str]) -> str:
    """The side the bound is taken against: smg where it ran, else direct (round-robin, which always runs)."""
    return "smg" if "smg" in sides else "direct"


def fit_prefill(rows: Iterable[Outcome], min_rows: int = MIN_FIT_ROWS) -> tuple[PrefillModel | None, int]:
    """The prefill model fitted to every answered row's ``(prompt_n, cache_n, prompt_ms)``, and the rows used;
    ``None`` with fewer than ``min_rows`` of them, or fewer than three distinct ``(prompt_n, cache_n)`` (three
    coefficients)."""
    usable = [r for r in rows if r.status == OK and r.prompt_n > 0 and r.prompt_ms > 0]
    if len(usable) < max(3, min_rows) or len({(r.prompt_n, r.cache_n) for r in usable}) < 3:
        return None, len(usable)
    model = PrefillModel(window=len(usable), min_observations=len(usable))
    for r in usable:
        model.observe(r.prompt_n, r.cache_n, r.prompt_ms / 1000)
    return model, len(usable)


def prefill_bound(
    fit: Iterable[Outcome],
    peer: str,
    requests: Iterable[tuple[int, Outcome]],
    ceiling: Sequence[tuple[int, int]],
    min_rows: int = MIN_FIT_ROWS,
) -> PrefillBound:
    """The peer's prefill over the prefill with the ceiling's reuse, on the peer's answered ``requests``
    (``(workload index, outcome)``).

    ``fit``: the run's timing rows (every side's: the replicas are alike), to which the prefill model is fitted
    (:func:`fit_prefill`). Each request's ceiling split is :func:`~loadtest.bench._kv_reuse.ceiling_tokens`'
    ``(cached, prompt)`` for its index, scaled from estimated tokens to the server's count of the prompt
    (``cache_n + prompt_n``), as :func:`~loadtest.bench._kv_reuse.reuse_losses` scales it; it is not raised to what
    the peer reported (an estimate below a report shows as a bound below 1, as ``reuse_vs_ceiling`` above 1).

    ``time``: the sum of the model's ``seconds(prompt_n, cache_n)`` of the peer's reported split over the sum of
    ``seconds(prompt - cached, cached)`` of the ceiling's. The numerator is the model's estimate, not the measured
    ``prompt_ms``: the denominator can only be an estimate, and the same model on both sides makes the ratio
    depend on the splits alone — 1 where the peer reused what the ceiling does — where a measured numerator would
    add the fit's residuals, and under load the time other slots' prompts took in the same batches, to what reuse
    can buy. ``tokens``: the peer's tokens computed over the ceiling's (what the token share implies).
    """
    model, rows = fit_prefill(fit, min_rows)
    peer_s = ceiling_s = 0.0
    peer_tokens = ceiling_tokens = counted = 0
    for index, outcome in requests:
        total = outcome.cache_n + outcome.prompt_n
        if outcome.status != OK or total <= 0:
            continue
        cached_estimate, prompt_estimate = ceiling[index]
        cached = min(total, round(cached_estimate * total / prompt_estimate)) if prompt_estimate else 0
        counted += 1
        peer_tokens += outcome.prompt_n
        ceiling_tokens += total - cached
        if model is not None:
            peer_s += model.seconds(outcome.prompt_n, outcome.cache_n)
            ceiling_s += model.seconds(total - cached, cached)
    return PrefillBound(
        peer=peer,
        time=peer_s / ceiling_s if model is not None and ceiling_s > 0 else None,
        tokens=peer_tokens / ceiling_tokens if ceiling_tokens else None,
        requests=counted,
        fit_rows=rows,
        coefficients=model.coefficients if model is not None else None,
    )
