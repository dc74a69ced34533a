"""Prefill-time model of one backend: how long computing ``n`` new prompt tokens takes after ``c`` cached
ones.

``seconds(n, c) = fixed_s + per_token_s * n + per_token_context_s * n * (c + n / 2) / 1000``

The first two terms are the usual fixed + per-token cost; the third is attention over the context (each new
token attends to everything before it), which makes a document's recompute cost depend on its position — the
"prefix-aware" cost of RAGCache's PGDSF. The defaults describe a small GPU-served model; :meth:`observe`
collects what backends report (llama.cpp ``timings.prompt_ms`` / ``prompt_n`` / ``cache_n``, or measured time
to first token) and refits the three coefficients with least squares (numpy) over a bounded window;
coefficients stay non-negative.

:func:`share_fits`: a replica's model that has not been fitted yet takes the mean coefficients of the fitted ones.
The replicas behind one proxy serve the same model, and the router compares their estimates: one left at the
defaults looks slower (or faster) than it is. In the load benchmark (``python -m loadtest.bench kv_load``) a
second replica left at a pessimistic default was never chosen, so it was never fitted either: the proxy served
everything from one of its two replicas.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PrefillCoefficients:
    fixed_s: float = 0.02
    per_token_s: float = 0.0002
    per_token_context_s: float = 0.0


class PrefillModel:
    """Estimated prefill time, refitted from observations."""

    def __init__(
        self,
        coefficients: PrefillCoefficients | None = None,
        *,
        window: int = 256,
        min_observations: int = 8,
    ) -> None:
        self.coefficients = coefficients or PrefillCoefficients()
        self.min_observations = min_observations
        self._observations: deque[tuple[int, int, float]] = deque(maxlen=window)

    @property
    def fitted(self) -> bool:
        """Whether the coefficients come from this backend's own observations."""
        return len(self._observations) >= self.min_observations

    def seconds(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Estimated time to prefill ``new_tokens`` after ``cached_tokens`` already in the KV cache."""
        if new_tokens <= 0:
            return 0.0
        c = self.coefficients
        return (
            c.fixed_s
            + c.per_token_s * new_tokens
            + c.per_token_context_s * new_tokens * (cached_tokens + new_tokens / 2) / 1000
        )

    def marginal_seconds(self, tokens: int, prefix_tokens: int) -> float:
        """Recompute cost of a ``tokens``-long segment behind a cached ``prefix_tokens`` (no fixed part)."""
        if tokens <= 0:
            return 0.0
        c = self.coefficients
        return c.per_token_s * tokens + c.per_token_context_s * tokens * (prefix_tokens + tokens / 2) / 1000

    def observe(self, new_tokens: int, cached_tokens: int, seconds: float) -> None:
        """Record one measured prefill; refits once ``min_observations`` are collected."""
        if new_tokens <= 0 or seconds < 0:
            return
        self._observations.append((new_tokens, cached_tokens, seconds))
        if len(self._observations) >= self.min_observations:
            self.fit()

    def fit(self) -> PrefillCoefficients:
        """Least-squares fit of the coefficients to the recorded observations (non-negative)."""
        if len(self._observations) < 3:
            return self.coefficients
        data = np.array(self._observations, dtype=float)
        n, c, y = data[:, 0], data[:, 1], data[:, 2]
        features = np.column_stack([np.ones_like(n), n, n * (c + n / 2) / 1000])
        coef = _nonnegative_lstsq(features, y)
        self.coefficients = PrefillCoefficients(float(coef[0]), float(coef[1]), float(coef[2]))
        return self.coefficients


def share_fits(models: Sequence[PrefillModel]) -> bool:
    """Give the models not fitted yet the mean coefficients of the fitted ones; returns whether any is still
    unfitted (so the caller can stop calling once every one has its own fit)."""
    fitted = [m.coefficients for m in models if m.fitted]
    unfitted = [m for m in models if not m.fitted]
    if fitted and unfitted:
        mean = PrefillCoefficients(*(float(np.mean(values)) for values in zip(*(
            (c.fixed_s, c.per_token_s, c.per_token_context_s) for c in fitted), strict=True)))
        for model in unfitted:
            model.coefficients = mean
    return bool(unfitted)


def _nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients: drop the most negative column until none is negative."""
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            return coef
        del active[int(np.argmin(sol))]
    return coef
