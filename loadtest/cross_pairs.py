"""Cross-question pairs of a run in one context: questions of different clusters that the proxy served one for the
other, or that were near enough (by the bench's embedding) for the proxy to compare their answers; and extra labels
read back for them (:func:`read_extra`, :func:`with_extra`)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.fidelity_traffic import clusters
from tiers.labelled_pairs import LabelledPair

NEAR = 0.85
"""Cosine from which a question's nearest earlier question of another cluster is listed."""


def nearest_cross(order: Sequence[str], vectors: dict[str, np.ndarray], by_question: dict[str, int],
                  floor: float = NEAR) -> list[tuple[str, str]]:
    """For each question in the order asked, its nearest earlier question of another cluster at cosine ``floor`` or
    above: (earlier, later)."""
    seen: list[str] = []
    found: list[tuple[str, str]] = []
    for question in dict.fromkeys(order):
        if seen:
            matrix = np.stack([vectors[q] for q in seen])
            cosines = matrix @ vectors[question] / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(vectors[question]))
            others = [i for i in np.argsort(-cosines) if by_question[seen[i]] != by_question[question]]
            if others and cosines[others[0]] >= floor:
                found.append((seen[others[0]], question))
        seen.append(question)
    return found


def write_cross(path: Path, rows: Iterable[tuple[str, str]]) -> int:
    """Write distinct unordered pairs as CSV ``question1,question2``; how many."""
    distinct = list(dict.fromkeys(tuple(sorted(row)) for row in rows if row[0] != row[1]))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("question1", "question2"))
        writer.writerows(distinct)
    return len(distinct)


def read_extra(path: Path) -> list[LabelledPair]:
    """Rows ``question1,question2,same_answer`` (1: one answer serves both; 0: they need different answers)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return [LabelledPair(row["question1"], row["question2"], row["same_answer"].strip() == "1")
                for row in csv.DictReader(handle)]


@dataclass(frozen=True, slots=True)
class ExtraUse:
    """What extra labels did: rows read, clusters they joined, pairs they confirmed apart, and rows labelled 0 whose
    questions other labels put in one cluster all the same."""

    read: int
    joined: int
    apart: int
    conflicting: int


def with_extra(pairs: Sequence[LabelledPair], extra: Sequence[LabelledPair]) -> tuple[dict[str, int], ExtraUse]:
    """Question → cluster with the extra labels: a row labelled 1 joins its two questions' clusters (union-find over
    all labels), a row labelled 0 keeps them apart unless other labels join them."""
    before = clusters(pairs)
    after = clusters([*pairs, *extra])
    joined = sum(p.duplicate and before.get(p.question1, -1) != before.get(p.question2, -2) for p in extra)
    apart = [p for p in extra if not p.duplicate]
    conflicting = sum(after[p.question1] == after[p.question2] for p in apart)
    return after, ExtraUse(len(extra), joined, len(apart) - conflicting, conflicting)
