"""The L2 hit decision as an error bound: per namespace, the lowest cosine threshold whose estimated share of wrong
hits stays within ``cache.l2.max_wrong_hit_rate``.

Estimate at threshold ``t`` in a namespace (a Beta-style blend of a prior curve and that namespace's own evidence)::

    wrong(t) = (PRIOR_WEIGHT * prior(t) + disagreements with score >= t) / (PRIOR_WEIGHT + observations with score >= t)

- ``prior(t)``: :data:`PRIOR_WRONG_SHARE`, the share of wrong hits among pairs at or above ``t`` measured on the
  calibration half of a labelled set of real question pairs (Quora Question Pairs, MeanCache's validation split,
  halves by :func:`proxy.calibrate.half_of`) with the default embedder and guards; see BENCHMARKS.md.
- evidence (vCache-style feedback, Schroeder et al. 2025): when a request misses L2 although a cached question of
  the same context scored at least :data:`GRID` ``[0]``, the upstream's fresh answer is compared with the cached
  answer of that question (no extra upstream call: the request is forwarded anyway; the comparison runs in the
  background, :data:`tiers.semantic.MAX_COMPARISONS` at a time); and a share ``verify_fraction`` of would-be hits
  is forwarded instead of served and compared the same way. Each comparison is one observation ``(score, agreed)``.

The threshold is the lowest point of :data:`GRID` where the estimate's one-sided 95% upper bound (:func:`bounds`) is
within the target (and that the prior allows or the namespace observed at least :data:`MIN_EVIDENCE` times: no
extrapolation below evidence); else the namespace serves no semantic hits (a miss costs money, a wrong answer costs
trust) and reports the estimate at the strictest point. Why the bound and not the estimate: above the threshold the
only evidence is the sampled verification, so there the estimate is mostly the prior, measured on other traffic; on
one shared context (``loadtest.bench fidelity --mode population``) the point estimate said 14.5% while 23% of the
hits were wrong. Thin evidence keeps the threshold up, and while it is up near misses are compared (evidence
without an extra upstream call), so a namespace whose traffic is clean earns lower thresholds and one whose traffic
is not never does. Evidence is kept per tenant and namespace, in an LRU of :data:`MAX_NAMESPACES`. Pure: no I/O; the
answer comparison that needs an embedding lives in :class:`tiers.semantic.SemanticTier`.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

GRID: tuple[float, ...] = tuple(round(0.70 + 0.01 * i, 2) for i in range(30))
"""Thresholds considered: 0.70, 0.71, ..., 0.99."""

PRIOR_WRONG_SHARE: tuple[float, ...] = (
    0.331, 0.326, 0.322, 0.314, 0.307, 0.301, 0.293, 0.283, 0.277, 0.267,
    0.262, 0.252, 0.243, 0.231, 0.225, 0.215, 0.209, 0.203, 0.198, 0.183,
    0.173, 0.159, 0.140, 0.124, 0.115, 0.103, 0.096, 0.097, 0.088, 0.111,
)  # fmt: skip
"""Wrong hits / hits at each :data:`GRID` threshold, pairwise, calibration half of qqp_dev.csv, with the default
embedder (int8 MiniLM) and guards: ``ragproxy calibrate ../shared/data/qqp_dev.csv --half calibration --curve``."""

PRIOR_WEIGHT = 20.0
"""How many observations the prior counts for: a namespace's own evidence outweighs it after a few dozen."""

CONFIDENCE_Z = 1.645
"""One-sided 95% normal quantile of the upper bound a threshold must meet."""

MIN_EVIDENCE = 5
"""Observations a grid cell needs before the namespace's own evidence may set the threshold there."""

MAX_NAMESPACES = 4096
UNREACHABLE = 1.01
"""The threshold of a namespace where no grid point meets the target: no cosine reaches it, so no hit is served."""


@dataclass(slots=True)
class Evidence:
    """Observations of one namespace, bucketed by :data:`GRID` cell."""

    observed: list[int] = field(default_factory=lambda: [0] * len(GRID))
    disagreed: list[int] = field(default_factory=lambda: [0] * len(GRID))

    def add(self, score: float, agreed: bool) -> None:
        cell = cell_of(score)
        if cell is None:
            return
        self.observed[cell] += 1
        if not agreed:
            self.disagreed[cell] += 1

    @property
    def total(self) -> int:
        return sum(self.observed)


def cell_of(score: float) -> int | None:
    """The :data:`GRID` cell ``score`` falls in (``None`` below the grid)."""
    if score < GRID[0]:
        return None
    return min(len(GRID) - 1, int(round((score - GRID[0]) * 100, 6)))


def estimates(evidence: Evidence | None, prior: tuple[float, ...] = PRIOR_WRONG_SHARE,
              weight: float = PRIOR_WEIGHT) -> list[float]:
    """The estimated wrong-hit share at every :data:`GRID` threshold."""
    result = [0.0] * len(GRID)
    observed = disagreed = 0
    for cell in reversed(range(len(GRID))):
        if evidence is not None:
            observed += evidence.observed[cell]
            disagreed += evidence.disagreed[cell]
        result[cell] = (weight * prior[cell] + disagreed) / (weight + observed)
    return result


def upper_bound(share: float, n: float) -> float:
    """One-sided 95% upper bound of a share observed over ``n`` trials (Wilson's score interval: sound at a share of
    0 or a handful of trials, where the normal approximation claims certainty)."""
    if n <= 0:
        return 1.0
    z2 = CONFIDENCE_Z * CONFIDENCE_Z
    centre = share + z2 / (2 * n)
    spread = CONFIDENCE_Z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z2 / n))


def bounds(evidence: Evidence | None, prior: tuple[float, ...] = PRIOR_WRONG_SHARE,
           weight: float = PRIOR_WEIGHT) -> list[float]:
    """The one-sided 95% upper bound (:func:`upper_bound`) of the wrong-hit share at every :data:`GRID` threshold,
    the prior counted as ``weight`` observations."""
    shares = estimates(evidence, prior, weight)
    counted = [weight] * len(GRID)
    if evidence is not None:
        above = 0
        for cell in reversed(range(len(GRID))):
            above += evidence.observed[cell]
            counted[cell] += above
    return [upper_bound(share, n) for share, n in zip(shares, counted, strict=True)]


def choose_threshold(target: float, evidence: Evidence | None) -> tuple[float, float, float]:
    """(threshold, estimated wrong-hit share there, its upper bound): the lowest grid point whose bound is within
    ``target`` that the prior alone allows or where the namespace has at least :data:`MIN_EVIDENCE` observations of
    its own (never extrapolated below what was observed), else (:data:`UNREACHABLE`, the figures at the strictest
    point)."""
    shares, uppers = estimates(evidence), bounds(evidence)
    for cell, threshold in enumerate(GRID):
        observed = evidence.observed[cell] if evidence is not None else 0
        if uppers[cell] <= target and (PRIOR_WRONG_SHARE[cell] <= target or observed >= MIN_EVIDENCE):
            return threshold, shares[cell], uppers[cell]
    return UNREACHABLE, shares[-1], uppers[-1]


@dataclass(frozen=True, slots=True)
class Operating:
    """Where one namespace runs: its threshold, the estimated wrong-hit share there, how it was set."""

    threshold: float
    estimated_wrong_hit_rate: float | None
    wrong_hit_rate_bound: float | None
    """The estimate's one-sided 95% upper bound."""
    observations: int
    source: Literal["calibrated", "fixed"]

    def as_dict(self) -> dict[str, float | int | str | None]:
        """The JSON form of the admin API (shares rounded to 4 places)."""
        return {"threshold": self.threshold, "observations": self.observations, "source": self.source,
                "estimated_wrong_hit_rate": _rounded(self.estimated_wrong_hit_rate),
                "wrong_hit_rate_bound": _rounded(self.wrong_hit_rate_bound)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Calibrator:
    """Per-namespace thresholds meeting ``target``, or the operator's fixed ones; feeds on observations.

    Evidence is kept per tenant and namespace (a shared namespace's tenant is the shared one): a tenant's traffic
    moves its own thresholds, never another tenant's. Without evidence a namespace runs on the prior alone."""

    def __init__(self, target: float, *, fixed: float | None = None, namespace_fixed: dict[str, float] | None = None,
                 verify_fraction: float = 0.0, rng: random.Random | None = None) -> None:
        """``target``: largest estimated wrong-hit share; ``fixed``: one cosine threshold for every namespace
        (an explicit override: no calibration); ``namespace_fixed``: per-namespace fixed thresholds (as written by
        ``ragproxy calibrate --write``); ``verify_fraction``: share of would-be hits forwarded to check them."""
        self.target = target
        self.fixed = fixed
        self.namespace_fixed = dict(namespace_fixed or {})
        self.verify_fraction = verify_fraction
        self._rng = rng or random.Random()
        self._evidence: OrderedDict[tuple[str, str], tuple[Evidence, Operating | None]] = OrderedDict()
        """(tenant, namespace) → its evidence and the operating point computed from it (``None``: not yet)."""
        self._prior_only: dict[float | None, Operating] = {}
        """The operating point without evidence, per fixed threshold (``None``: calibrated)."""

    def operating(self, namespace: str, tenant: str = "") -> Operating:
        """The threshold ``namespace`` runs at now for ``tenant``."""
        held = self._evidence.get((tenant, namespace))
        if held is None:
            return self.prior_point(namespace)
        evidence, found = held
        if found is None:
            found = self._operating(self.namespace_fixed.get(namespace, self.fixed), evidence)
            self._evidence[(tenant, namespace)] = (evidence, found)
        return found

    def prior_point(self, namespace: str) -> Operating:
        """Where ``namespace`` runs for a tenant without evidence of its own."""
        fixed = self.namespace_fixed.get(namespace, self.fixed)
        found = self._prior_only.get(fixed)
        if found is None:
            found = self._prior_only[fixed] = self._operating(fixed, None)
        return found

    def _operating(self, fixed: float | None, evidence: Evidence | None) -> Operating:
        observations = evidence.total if evidence is not None else 0
        if fixed is None:
            return Operating(*choose_threshold(self.target, evidence), observations, "calibrated")
        cell = cell_of(fixed)
        share, upper = (estimates(evidence)[cell], bounds(evidence)[cell]) if cell is not None else (None, None)
        return Operating(fixed, share, upper, observations, "fixed")

    def threshold(self, namespace: str, tenant: str = "") -> float:
        return self.operating(namespace, tenant).threshold

    def should_verify(self) -> bool:
        """Whether to forward this would-be hit and compare answers instead of serving it."""
        return self.verify_fraction > 0 and self._rng.random() < self.verify_fraction

    def observe(self, namespace: str, score: float, agreed: bool, tenant: str = "") -> None:
        """One comparison of a cached answer with the fresh answer to a question that scored ``score``."""
        slot = (tenant, namespace)
        held = self._evidence.pop(slot, None)
        evidence = held[0] if held is not None else Evidence()
        evidence.add(score, agreed)
        self._evidence[slot] = (evidence, None)  # the most recent last; its operating point is recomputed
        while len(self._evidence) > MAX_NAMESPACES:
            self._evidence.popitem(last=False)

    def points(self) -> dict[str, Operating]:
        """Every namespace seen so far (plus ``default``) on the prior alone, then each tenant's namespace with
        evidence as ``tenant/namespace``."""
        names = {"default", *self.namespace_fixed, *(namespace for _, namespace in self._evidence)}
        found = {name: self.prior_point(name) for name in sorted(names)}
        for tenant, namespace in sorted(self._evidence):
            found[f"{tenant}/{namespace}"] = self.operating(namespace, tenant)
        return found

    def report(self) -> dict[str, dict[str, float | int | str | None]]:
        """:meth:`points` in the admin API's JSON form."""
        return {name: point.as_dict() for name, point in self.points().items()}


def answers_agree_exactly(cached: str, fresh: str) -> bool:
    """Whether two answers are the same text up to whitespace and case."""
    return " ".join(cached.split()).casefold() == " ".join(fresh.split()).casefold()
