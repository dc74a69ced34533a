"""Labelled question pairs: the development data the semantic tier's prior and thresholds are measured on.

A CSV with a header holding ``question1``, ``question2``, ``is_duplicate`` (1/0) and, optionally, ``namespace`` and
``same_answer`` (1/0, or empty where not judged: would one cached answer serve both questions?). Read by
``ragproxy calibrate`` (:mod:`commands.calibrate`) and by the fidelity benchmarks; never shipped, never read at
run
time.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

HALVES = ("calibration", "held-out")
LABELS = ("is_duplicate", "same_answer")


@dataclass(frozen=True, slots=True)
class LabelledPair:
    """Two questions and whether one answer serves both (``duplicate``), in a namespace."""

    question1: str
    question2: str
    duplicate: bool
    namespace: str = "default"


class PairsError(ValueError):
    """A pairs file that cannot be read."""


def read_pairs(path: Path, namespace: str = "default", labels: str = "is_duplicate") -> list[LabelledPair]:
    """The pairs of a CSV file (columns question1, question2, is_duplicate, optional namespace and same_answer),
    labelled by ``labels`` (``same_answer``: that column where given, ``is_duplicate`` elsewhere)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = {"question1", "question2", "is_duplicate", labels} - set(reader.fieldnames or ())
            if missing:
                raise PairsError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            return [LabelledPair(row["question1"], row["question2"],
                                 (row[labels].strip() or row["is_duplicate"].strip()) == "1",
                                 row.get("namespace") or namespace) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PairsError(f"{path}: {exc}") from None


def half_of(pair: LabelledPair) -> str:
    """The deterministic half a pair belongs to: by the parity of sha256 of its two questions."""
    digest = hashlib.sha256(f"{pair.question1}\x1f{pair.question2}".encode()).digest()
    return HALVES[digest[-1] & 1]
