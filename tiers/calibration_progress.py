"""How far a namespace's calibration has come: its comparisons so far, and what it would serve at its evidence.

A calibrating namespace serves no semantic hit until its own comparisons bound the wrong share of its hits
(:mod:`tiers.calibration`). What an operator wants to know in the first hour is how far off that is: how many
comparisons it has (and how many agreed), the threshold it serves at now, and, while it serves none, about how many
more agreeing comparisons it needs and the threshold it would then serve at. "Agreeing comparisons like those so
far": each added where most of its comparisons landed (the grid cell its comparisons, else its lookups, fell in most;
:data:`~tiers.calibration.SERVE_FLOOR`'s cell when it has neither), the same decision
(:func:`~tiers.calibration.choose_threshold`) run on the evidence with them. An estimate of the distance, never
evidence: nothing is served on it. Pure.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace

from tiers.calibration import GRID, SERVE_FLOOR, Calibrator, Evidence, choose_threshold

MOST_NEEDED = 2000
"""Beyond this many more agreeing comparisons, the distance is not worth a number (``needs`` is ``None``)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """One namespace's calibration so far (:func:`progress`)."""

    comparisons: int
    agreed: int
    state: str
    """``calibrating``, ``serving`` or ``fixed`` (:attr:`tiers.calibration.Operating.state`)."""
    threshold: float | None
    """The threshold hits are served at now; ``None`` while calibrating."""
    needs: int | None = None
    """While calibrating: about how many more agreeing comparisons like those so far until a threshold serves
    (``None``: more than :data:`MOST_NEEDED`, or not calibrating)."""
    would_serve_at: float | None = None
    """The threshold it would then serve at."""

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {"comparisons": self.comparisons, "agreed": self.agreed, "needs": self.needs,
                "would_serve_at": self.would_serve_at, "summary": self.summary()}

    def summary(self) -> str:
        """One line: ``12 comparisons (11 agreed); calibrating: about 8 more agreeing comparisons to serve at
        0.96``."""
        counted = f"{self.comparisons} comparison{'' if self.comparisons == 1 else 's'} ({self.agreed} agreed)"
        if self.state == "fixed":
            return f"{counted}; fixed threshold {self.threshold:g}"
        if self.state == "serving":
            return f"{counted}; serving at threshold {self.threshold:g}"
        if self.needs is None:
            return f"{counted}; calibrating: no threshold within reach of {MOST_NEEDED} more agreeing comparisons"
        return (f"{counted}; calibrating: about {self.needs} more agreeing comparison{'' if self.needs == 1 else 's'} "
                f"to serve at {self.would_serve_at:g}")


def progress(target: float, evidence: Evidence | None, state: str, threshold: float) -> Progress:
    """Where a namespace with ``evidence`` stands, running at ``threshold`` in ``state`` under ``target``."""
    evidence = evidence or Evidence()
    comparisons, agreed = evidence.total, evidence.total - sum(evidence.disagreed)
    if state != "calibrating":
        return Progress(comparisons, agreed, state, threshold)
    cell = _typical_cell(evidence)
    low, high = 0, MOST_NEEDED
    if choose_threshold(target, _with_agreeing(evidence, cell, high))[0] > 1:
        return Progress(comparisons, agreed, state, None)
    while low + 1 < high:  # the fewest added agreeing comparisons at which a threshold serves
        middle = (low + high) // 2
        if choose_threshold(target, _with_agreeing(evidence, cell, middle))[0] > 1:
            low = middle
        else:
            high = middle
    return Progress(comparisons, agreed, state, None, high,
                    choose_threshold(target, _with_agreeing(evidence, cell, high))[0])


def _typical_cell(evidence: Evidence) -> int:
    for counts in (evidence.observed, evidence.looked):
        if any(counts):
            return max(range(len(GRID)), key=lambda cell: (counts[cell], cell))
    return GRID.index(SERVE_FLOOR)


def _with_agreeing(evidence: Evidence, cell: int, count: int) -> Evidence:
    observed = array("q", evidence.observed)
    observed[cell] += count
    return replace(evidence, observed=observed, disagreed=array("q", evidence.disagreed),
                   looked=array("q", evidence.looked))


class ProgressBoard:
    """Each namespace's :class:`Progress`, computed again only when its evidence changed, and the lines worth
    logging as it goes: its first comparison, every doubling of its comparisons from 8 on, and every change of
    state (calibrating → serving). No I/O: the caller logs what :meth:`news` returns."""

    def __init__(self, calibrator: Calibrator) -> None:
        self.calibrator = calibrator
        self._known: dict[tuple[str, str], tuple[tuple[int, int, str, float], Progress]] = {}
        self._logged: dict[tuple[str, str], tuple[int, str]] = {}

    def of(self, namespace: str, tenant: str = "") -> Progress:
        """``tenant``'s ``namespace`` now."""
        evidence = self.calibrator.evidence_of(namespace, tenant)
        point = self.calibrator.operating(namespace, tenant)
        total = evidence.total if evidence is not None else 0
        seen = (total, sum(evidence.disagreed) if evidence is not None else 0, point.state, point.threshold)
        slot = (tenant, namespace)
        known = self._known.get(slot)
        if known is not None and known[0] == seen:
            return known[1]
        found = progress(self.calibrator.target, evidence, point.state, point.threshold)
        if len(self._known) >= self.calibrator.capacity:
            self._known.clear()
        self._known[slot] = (seen, found)
        return found

    def report(self) -> dict[str, dict[str, float | int | str | None]]:
        """:meth:`Calibrator.report` with each row's progress (``comparisons``, ``agreed``, ``needs``,
        ``would_serve_at``, ``summary``)."""
        rows = self.calibrator.report()
        for name, row in rows.items():
            tenant, _, namespace = name.rpartition("/")
            row.update(self.of(namespace, tenant).as_dict())
        return rows

    def news(self, namespace: str, tenant: str = "") -> str | None:
        """A line to log about ``tenant``'s ``namespace`` after a comparison, or ``None`` when nothing worth a line
        happened."""
        now = self.of(namespace, tenant)
        slot = (tenant, namespace)
        count, state = self._logged.get(slot, (0, "calibrating"))
        milestone = now.comparisons == 1 or (now.comparisons >= 8 and now.comparisons >= 2 * max(count, 4))
        if not milestone and now.state == state:
            return None
        if len(self._logged) >= self.calibrator.capacity:
            self._logged.clear()
        self._logged[slot] = (now.comparisons, now.state)
        return now.summary()
