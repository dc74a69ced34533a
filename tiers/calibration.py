"""The L2 hit decision as an error bound: per tenant and namespace, the lowest cosine threshold at which the share of
wrong semantic hits served stays, with 95% confidence, within ``cache.l2.max_wrong_hit_rate``.

The model (why the bound holds, and what it assumes: docs/semantic.md). A lookup's best candidate scores ``s``
(cosine after the guards); it falls in one :data:`GRID` cell ``c``. The chance that the cached answer is wrong for
the new question there is::

    wrong(c) = 1 - sigmoid(theta + offset(c)),    offset(c) = logit(1 - PRIOR_WRONG_SHARE[c])

- :data:`PRIOR_WRONG_SHARE`, the **shape**: the share of labelled real question pairs in each cell whose questions
  need different answers (``same_answer``), measured once on the calibration half of the development pairs with
  the default embedder and guards, monotone, each value with its real sample size (:data:`PRIOR_PAIRS`). It says
  how much more often a pair at 0.95 needs the same answer than a pair at 0.88.
- ``theta``, the **mix**: how much more (or less) often this namespace's close questions need the same answer than
  the prior's did. It is the one thing learned per namespace, from that namespace's own comparisons of a cached
  answer with the fresh answer to the new question (vCache-style feedback, Schroeder et al. 2025): every near miss
  whose best candidate scored at least ``GRID[0]`` (forwarded anyway: no extra upstream call) and a share of
  would-be hits forwarded instead of served (:meth:`Calibrator.should_verify`). A disagreement counts as a wrong
  hit. Because the shape ties the cells together, every comparison informs every threshold: a namespace whose
  near misses at 0.88 mostly agree learns that its hits at 0.93 are right too, without waiting for comparisons at
  0.93 (which only sampled verification would give). This is label-shift adaptation (the class-conditional score
  distributions of the prior hold, the class mix is the namespace's own).

The decision: ``theta_low``, the one-sided 95% lower bound of ``theta`` that holds at every moment (a confidence
sequence: :meth:`Evidence.theta_lower`), turns into an upper bound of ``wrong(c)`` in every cell; the bound of the
share served at threshold ``t`` is those bounds averaged over the cells at or above ``t``, weighted by how often
this namespace's lookups landed in each
(:meth:`Evidence.served_share`). The threshold is the lowest grid point at or above :data:`SERVE_FLOOR` whose bound
is within the target, and whose own observations at or above it do not show, at 95% confidence, a share above the
target (a model-free check that catches a namespace whose traffic does not follow the shape). Without any
observation nothing is served: the namespace is *calibrating* and says so (``/admin/stats``, the start-up summary).
Evidence is kept per tenant and namespace, within a byte budget (``cache.l2.calibration_max_bytes``,
:data:`NAMESPACE_BYTES` each): beyond it, the least recently used namespace of the tenant holding the most goes
(:class:`~tiers.budgets.OwnedLRU`: a tenant naming thousands of namespaces pushes out its own); it never crosses
tenants. Pure: no I/O; comparing two answers is :class:`tiers.answer_check.AnswerAgreement`.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from tiers.budgets import MemoryAccount, OwnedLRU

GRID: tuple[float, ...] = tuple(round(0.70 + 0.01 * i, 2) for i in range(30))
"""Score cells: ``[0.70, 0.71)``, ..., ``[0.99, 1]``; a threshold is a cell's lower edge."""

PRIOR_WRONG_SHARE: tuple[float, ...] = (
    0.636, 0.630, 0.630, 0.585, 0.585, 0.585, 0.585, 0.573, 0.573, 0.444,
    0.444, 0.444, 0.444, 0.444, 0.444, 0.444, 0.444, 0.444, 0.417, 0.381,
    0.381, 0.303, 0.303, 0.204, 0.155, 0.155, 0.082, 0.069, 0.069, 0.069,
)  # fmt: skip
"""Share of pairs needing different answers in each :data:`GRID` cell (not at or above it), monotone (pooled where
adjacent cells disagree, and over at least 100 pairs from the top), calibration half of qqp_dev_relabelled.csv
(``same_answer``; Quora's ``is_duplicate`` below its labelled range), default embedder and guards:
``ragproxy calibrate ../shared/data/qqp_dev_relabelled.csv --labels same_answer --half calibration --prior``."""

PRIOR_PAIRS: tuple[int, ...] = (
    33, 35, 46, 61, 50, 50, 56, 43, 60, 70,
    77, 71, 92, 68, 72, 86, 89, 84, 115, 97,
    92, 112, 83, 103, 89, 105, 73, 90, 85, 27,
)  # fmt: skip
"""The labelled pairs each value of :data:`PRIOR_WRONG_SHARE` was measured on (same command)."""

SERVE_FLOOR = 0.85
"""No threshold below it: the prior's ``same_answer`` labels start there (below, only Quora's ``is_duplicate``, which
disagrees with them on 23% of the pairs where both exist)."""

CONFIDENCE_Z = 1.645
"""One-sided 95% normal quantile (of the model-free check)."""
ALPHA = 0.05
"""Chance that the mix is ever overestimated, over the namespace's whole life (:meth:`Evidence.theta_lower`)."""
MIXES: npt.NDArray[np.float64] = np.arange(-4.0, 6.0 + 1e-9, 0.02)
"""The mixes ``theta`` considered: from about 1 in 55 to 400 times the prior's odds of needing the same answer, in
steps of 0.02 (the bound gives one step away: :meth:`Evidence.theta_lower`)."""
ALTERNATIVES_SCALE = 1.5
"""How far above a mix the mixes weighed against it lie (:meth:`Evidence.theta_lower`): a half-normal of this scale
(in logit units) over the mixes above it, chosen on replays of the calibration half (BENCHMARKS.md, issue 30)."""

VERIFY_WHILE_SCARCE = 0.1
"""Share of would-be hits forwarded to compare while a namespace has fewer than :data:`CHECKED` comparisons at or
above its threshold (a forwarded would-be hit costs what a miss costs)."""
CHECKED = 20

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""``cache.l2.calibration_max_bytes``: 4,096 namespaces (:data:`NAMESPACE_BYTES`)."""
NAMESPACE_BYTES = 2048
"""What one namespace's evidence holds at most: three arrays of :data:`GRID` counters, its operating point and its
place in the budget, with a 64-character tenant and namespace (tracemalloc, ``tests/tiers/test_calibration.py``)."""
UNREACHABLE = 1.01
"""The threshold of a namespace where no grid point meets the target: no cosine reaches it, so no hit is served."""

_OFFSETS = tuple(math.log((1 - w) / w) for w in PRIOR_WRONG_SHARE)
_FLOOR_CELL = GRID.index(SERVE_FLOOR)
_LOGITS = MIXES[:, None] + np.array(_OFFSETS)[None, :]
_LOG_AGREE = -np.logaddexp(0.0, -_LOGITS)
"""log P(a comparison agrees) per mix (rows) and cell (columns)."""
_LOG_DISAGREE = -np.logaddexp(0.0, _LOGITS)


def _alternatives(scale: float) -> npt.NDArray[np.float64]:
    """The weight of each mix (columns) among the alternatives to each mix (rows): a half-normal of ``scale`` over
    the mixes strictly above it, summing to 1 (0 elsewhere; the top mix has none)."""
    above = MIXES[None, :] - MIXES[:, None]
    weights = np.where(above > 1e-9, np.exp(-above * above / (2 * scale * scale)), 0.0)
    totals = weights.sum(axis=1, keepdims=True)
    return np.asarray(weights / np.where(totals > 0, totals, 1.0))


_ALTERNATIVES = _alternatives(ALTERNATIVES_SCALE)


def cell_of(score: float) -> int | None:
    """The :data:`GRID` cell ``score`` falls in (``None`` below the grid)."""
    if score < GRID[0]:
        return None
    return min(len(GRID) - 1, int(round((score - GRID[0]) * 100, 6)))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def wilson(share: float, n: float, z: float = CONFIDENCE_Z) -> tuple[float, float]:
    """Wilson's score interval of a share observed over ``n`` trials: (lower, upper), one-sided at ``z``."""
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = share + z2 / (2 * n)
    spread = z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z2 / n)), min(1.0, (centre + spread) / (1 + z2 / n))


def upper_bound(share: float, n: float) -> float:
    """One-sided 95% upper bound of a share observed over ``n`` trials (Wilson)."""
    return wilson(share, n)[1]


def _cells() -> array[int]:
    return array("q", bytes(8 * len(GRID)))


@dataclass(slots=True)
class Evidence:
    """One namespace's observations per :data:`GRID` cell: comparisons made, disagreements among them, and lookups
    whose best candidate fell there (served or not: the mix of cells future hits come from). Counters are 64-bit
    arrays: a namespace's size does not grow with its counts."""

    observed: array[int] = field(default_factory=_cells)
    disagreed: array[int] = field(default_factory=_cells)
    looked: array[int] = field(default_factory=_cells)

    def add(self, score: float, agreed: bool) -> None:
        cell = cell_of(score)
        if cell is None:
            return
        self.observed[cell] += 1
        self.disagreed[cell] += not agreed

    def look(self, score: float) -> None:
        cell = cell_of(score)
        if cell is not None:
            self.looked[cell] += 1

    @property
    def total(self) -> int:
        return sum(self.observed)

    def _log_likelihoods(self) -> npt.NDArray[np.float64]:
        """Of the comparisons, under each of :data:`MIXES`."""
        observed, disagreed = np.array(self.observed, dtype=np.float64), np.array(self.disagreed, dtype=np.float64)
        return np.asarray(_LOG_AGREE @ (observed - disagreed) + _LOG_DISAGREE @ disagreed)

    def theta_estimate(self) -> float:
        """The most likely mix among :data:`MIXES` (``-inf`` when no comparison agreed)."""
        if self.total == sum(self.disagreed):
            return -math.inf
        return float(MIXES[int(np.argmax(self._log_likelihoods()))])

    def theta_lower(self) -> float:
        """A lower bound of the mix that holds, with probability ``1 - ALPHA``, at every moment of the namespace's
        life at once (``-inf`` below :data:`MIXES`): one step of :data:`MIXES` below the lowest mix ``theta`` whose
        likelihood is not ``1/ALPHA`` times below the likelihood of the mixes above it, averaged with fixed weights
        (a half-normal of :data:`ALTERNATIVES_SCALE` over the distance above ``theta``).

        For a mix at or above the true one, that average divided by its own likelihood is a nonnegative
        supermartingale of mean at most 1 as comparisons arrive (each factor ``p_a/p_theta`` of a mix ``a`` above
        ``theta`` has mean ``1 + (p_a - p_theta)(p - p_theta)/(p_theta(1 - p_theta)) <= 1`` when the true chance
        ``p`` of agreeing is at most ``p_theta``), so by Ville's inequality it ever reaches ``1/ALPHA`` with
        probability at most ``ALPHA``: a one-sided confidence sequence (Robbins 1970; Howard et al. 2021). The step
        below covers a true mix between two grid points (the grid point just above it is the one that must not be
        refused). Re-deciding after every comparison cannot wear it down, as it would a fixed-sample bound checked
        again and again. The weights decide how fast evidence turns into a bound, never whether the bound holds:
        any weights fixed in advance would do; these put most weight on the alternatives a few dozen to a few
        hundred comparisons can tell apart."""
        if self.total == sum(self.disagreed):
            return -math.inf
        likelihoods = self._log_likelihoods()
        top = likelihoods.max()  # an alternative too unlikely to count next to the likeliest underflows: less refused
        with np.errstate(divide="ignore"):
            against = np.log(_ALTERNATIVES @ np.exp(likelihoods - top)) + top
        inside = np.flatnonzero(against - likelihoods < math.log(1 / ALPHA))
        return -math.inf if not inside.size or inside[0] == 0 else float(MIXES[inside[0] - 1])

    def served_share(self, theta: float, cell: int) -> float:
        """The wrong share of hits served at threshold ``GRID[cell]`` under the mix ``theta``: each cell's wrong
        share, weighted by this namespace's lookups there (the threshold's own cell when it has none)."""
        weights = self.looked[cell:]
        total = sum(weights)
        if not total:
            return _sigmoid(-(theta + _OFFSETS[cell]))
        return sum(w * _sigmoid(-(theta + o)) for w, o in zip(weights, _OFFSETS[cell:], strict=True) if w) / total

    def observed_above(self, cell: int) -> tuple[int, int]:
        """(comparisons, disagreements) at or above ``GRID[cell]``."""
        return sum(self.observed[cell:]), sum(self.disagreed[cell:])


def _figures(evidence: Evidence, cell: int, low: float | None = None) -> tuple[float, float]:
    """(estimated wrong share of the hits served at ``GRID[cell]``, its upper bound; ``low``: the mix's lower bound
    when known)."""
    low, best = evidence.theta_lower() if low is None else low, evidence.theta_estimate()
    share = 1.0 if math.isinf(best) else evidence.served_share(best, cell)
    return share, 1.0 if math.isinf(low) else evidence.served_share(low, cell)


def choose_threshold(target: float, evidence: Evidence | None) -> tuple[float, float, float]:
    """(threshold, estimated wrong share of the hits it serves, that share's upper bound): the lowest grid point at
    or above :data:`SERVE_FLOOR` whose bound is within ``target`` and whose own comparisons at or above it do not
    show, at 95% confidence, a share above ``target``; else (:data:`UNREACHABLE`, the figures at the strictest
    point)."""
    if evidence is None or evidence.total == 0:
        return UNREACHABLE, PRIOR_WRONG_SHARE[-1], 1.0
    low = evidence.theta_lower()
    if not math.isinf(low):
        for cell in range(_FLOOR_CELL, len(GRID)):
            bound = evidence.served_share(low, cell)
            if bound > target:
                continue
            checked, disagreed = evidence.observed_above(cell)
            if checked and wilson(disagreed / checked, checked)[0] > target:
                continue
            return GRID[cell], _figures(evidence, cell, low)[0], bound
    return UNREACHABLE, *_figures(evidence, len(GRID) - 1, low)


@dataclass(frozen=True, slots=True)
class Operating:
    """Where one namespace runs: its threshold, the estimated wrong share of the hits it serves, how it was set."""

    threshold: float
    estimated_wrong_hit_rate: float | None
    """``None`` until the namespace has an observation (the prior alone is not this namespace's estimate)."""
    wrong_hit_rate_bound: float | None
    """The estimate's one-sided 95% upper bound."""
    observations: int
    source: Literal["calibrated", "fixed"]
    checked: int = 0
    """Comparisons at or above the threshold (sampled would-be hits, and near misses from when it was higher)."""

    @property
    def state(self) -> Literal["calibrating", "serving", "fixed"]:
        """``calibrating``: no threshold is within the bound yet, no semantic hit is served."""
        if self.source == "fixed":
            return "fixed"
        return "calibrating" if self.threshold > 1 else "serving"

    def as_dict(self) -> dict[str, float | int | str | None]:
        """The JSON form of the admin API (shares rounded to 4 places)."""
        return {"threshold": self.threshold, "state": self.state, "observations": self.observations,
                "checked": self.checked, "source": self.source,
                "estimated_wrong_hit_rate": _rounded(self.estimated_wrong_hit_rate),
                "wrong_hit_rate_bound": _rounded(self.wrong_hit_rate_bound)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Calibrator:
    """Per-namespace thresholds meeting ``target``, or the operator's fixed ones; feeds on observations.

    Evidence is kept per tenant and namespace (a shared namespace's tenant is the shared one): a tenant's traffic
    moves its own thresholds, never another tenant's. Without evidence a namespace is calibrating: no hits."""

    def __init__(self, target: float, *, fixed: float | None = None, namespace_fixed: dict[str, float] | None = None,
                 verify_fraction: float = 0.0, rng: random.Random | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """``target``: largest wrong share of served hits; ``fixed``: one cosine threshold for every namespace
        (an explicit override: no calibration); ``namespace_fixed``: per-namespace fixed thresholds (as written by
        ``ragproxy calibrate --write``); ``verify_fraction``: share of would-be hits forwarded to check them once a
        namespace has :data:`CHECKED` comparisons at or above its threshold (:data:`VERIFY_WHILE_SCARCE` before);
        ``max_bytes``: the budget of the evidence kept (:data:`NAMESPACE_BYTES` a namespace)."""
        self.target = target
        self.fixed = fixed
        self.namespace_fixed = dict(namespace_fixed or {})
        self.verify_fraction = verify_fraction
        self._rng = rng or random.Random()
        self.max_bytes = max_bytes
        self._evidence: dict[tuple[str, str], tuple[Evidence, Operating]] = {}
        """(tenant, namespace) → its evidence and the operating point computed from it."""
        self._kept: OwnedLRU[tuple[str, str]] = OwnedLRU()
        """The same namespaces in order of use, owned by their tenants (what leaves beyond the budget)."""

    @property
    def capacity(self) -> int:
        """How many namespaces' evidence the budget holds."""
        return self.max_bytes // NAMESPACE_BYTES

    def operating(self, namespace: str, tenant: str = "") -> Operating:
        """The threshold ``namespace`` runs at now for ``tenant``."""
        held = self._evidence.get((tenant, namespace))
        return held[1] if held is not None else self.prior_point(namespace)

    def prior_point(self, namespace: str) -> Operating:
        """Where ``namespace`` runs for a tenant without evidence of its own."""
        return self._operating(self.namespace_fixed.get(namespace, self.fixed), None)

    def _operating(self, fixed: float | None, evidence: Evidence | None) -> Operating:
        observations = evidence.total if evidence is not None else 0
        if fixed is None:
            threshold, share, bound = choose_threshold(self.target, evidence)
            cell = cell_of(threshold)
            checked = evidence.observed_above(cell)[0] if evidence is not None and cell is not None else 0
            if not observations:  # nothing observed: no estimate to show
                return Operating(threshold, None, None, 0, "calibrated")
            return Operating(threshold, share, bound, observations, "calibrated", checked)
        cell = cell_of(fixed)
        if cell is None or evidence is None or evidence.total == 0:  # no estimate before an observation
            return Operating(fixed, None, None, observations, "fixed")
        return Operating(fixed, *_figures(evidence, cell), observations, "fixed", evidence.observed_above(cell)[0])

    def threshold(self, namespace: str, tenant: str = "") -> float:
        return self.operating(namespace, tenant).threshold

    def should_verify(self, namespace: str = "default", tenant: str = "") -> bool:
        """Whether to forward this would-be hit and compare answers instead of serving it."""
        point = self.operating(namespace, tenant)
        rate = self.verify_fraction
        if point.source == "calibrated" and point.checked < CHECKED:
            rate = max(rate, VERIFY_WHILE_SCARCE)
        return rate > 0 and self._rng.random() < rate

    def _held(self, namespace: str, tenant: str) -> Evidence:
        held = self._evidence.get((tenant, namespace))
        return held[0] if held is not None else Evidence()

    def look(self, namespace: str, score: float, tenant: str = "") -> None:
        """A lookup whose best candidate scored ``score`` (its operating point is refreshed at the next
        observation: the mix of cells moves slowly)."""
        held = self._evidence.get((tenant, namespace))
        if held is not None:
            held[0].look(score)
            self._kept.touch((tenant, namespace))
        else:
            evidence = Evidence()
            evidence.look(score)
            self._keep(namespace, tenant, evidence)

    def observe(self, namespace: str, score: float, agreed: bool, tenant: str = "") -> None:
        """One comparison of a cached answer with the fresh answer to a question that scored ``score``."""
        evidence = self._held(namespace, tenant)
        evidence.add(score, agreed)
        self._keep(namespace, tenant, evidence)

    def evidence_of(self, namespace: str, tenant: str = "") -> Evidence | None:
        """The evidence ``tenant``'s ``namespace`` has gathered (``None``: none yet); not to be changed."""
        held = self._evidence.get((tenant, namespace))
        return held[0] if held is not None else None

    def seed(self, namespace: str, tenant: str, evidence: Evidence) -> None:
        """Start ``tenant``'s ``namespace`` from ``evidence`` gathered before (comparisons of real cached and fresh
        answers, as ``ragproxy calibrate --warm`` makes from an app's logs), added to what it has: the same sequence
        of comparisons, its earlier part (docs/semantic.md)."""
        held = self._held(namespace, tenant)
        for mine, more in ((held.observed, evidence.observed), (held.disagreed, evidence.disagreed),
                           (held.looked, evidence.looked)):
            for cell, count in enumerate(more[:len(GRID)]):
                mine[cell] += max(0, int(count))
        self._keep(namespace, tenant, held)

    def _keep(self, namespace: str, tenant: str, evidence: Evidence) -> None:
        slot = (tenant, namespace)
        self._evidence[slot] = (evidence, self._operating(self.namespace_fixed.get(namespace, self.fixed), evidence))
        self._kept.set(slot, tenant, NAMESPACE_BYTES)
        while self._kept.bytes > self.max_bytes:
            victim = self._kept.victim(keep=slot)
            victim = slot if victim is None else victim
            self._kept.remove(victim)
            del self._evidence[victim]

    def memory(self) -> list[MemoryAccount]:
        return [MemoryAccount("l2_calibration", self._kept.bytes, self.max_bytes, len(self._kept),
                              "cache.l2.calibration_max_bytes")]

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
