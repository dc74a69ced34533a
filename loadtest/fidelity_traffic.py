"""The traffic of the fidelity benchmark and its hindsight oracle: pure functions over labelled question pairs.

- :func:`clusters`: questions that need one answer (connected components of the pairs labelled 1);
- :func:`sample_mix`: ``count`` pairs of which a share ``mix`` need the same answer (``--mix``);
- :func:`population_order`: the order of ``--mode population``;
- :func:`oracle_curve` / :func:`oracle_population_curve`: what each fixed threshold of the grid would have served on
  the same traffic, with the proxy's own embedder and guards; :func:`best_at` picks the hindsight oracle, the
  threshold with the highest recall whose wrong share is within the bound;
- :func:`trivial_variants`: the same question as users retype it (``--mode variants``).
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from normalizer.text import technical
from tiers.calibration import GRID
from tiers.labelled_pairs import LabelledPair

Veto = Callable[[str, str], bool]
"""Whether the proxy's guards veto a match between two questions."""
NEIGHBOURS = 32


def clusters(pairs: Iterable[LabelledPair]) -> dict[str, int]:
    """Question → cluster number: connected components of the pairs labelled 1 (union-find)."""
    parent: dict[str, str] = {}

    def find(q: str) -> str:
        parent.setdefault(q, q)
        while parent[q] != q:
            parent[q] = parent[parent[q]]
            q = parent[q]
        return q

    for pair in pairs:
        a, b = find(pair.question1), find(pair.question2)
        if pair.duplicate and a != b:
            parent[a] = b
    roots: dict[str, int] = {}
    return {q: roots.setdefault(find(q), len(roots)) for q in list(parent)}


def same(pair: LabelledPair, by_question: dict[str, int]) -> bool:
    """Whether one answer serves both questions of ``pair`` (same cluster)."""
    return by_question[pair.question1] == by_question[pair.question2]


def sample_mix(pairs: Sequence[LabelledPair], by_question: dict[str, int], mix: float, count: int,
               seed: int) -> list[LabelledPair]:
    """``count`` pairs in random order, ``round(mix * count)`` of them needing the same answer; ``ValueError`` when
    ``pairs`` hold too few of either kind."""
    rng = random.Random(seed)
    alike = [p for p in pairs if same(p, by_question)]
    unlike = [p for p in pairs if not same(p, by_question)]
    wanted = round(mix * count)
    if wanted > len(alike) or count - wanted > len(unlike):
        raise ValueError(f"--mix {mix} of {count} pairs needs {wanted} same-answer and {count - wanted} other pairs; "
                         f"the pairs hold {len(alike)} and {len(unlike)}")
    chosen = rng.sample(alike, wanted) + rng.sample(unlike, count - wanted)
    rng.shuffle(chosen)
    return chosen


def population_order(pairs: Sequence[LabelledPair]) -> tuple[list[str], list[str]]:
    """Distinct first questions, then distinct second questions not among them."""
    firsts = list(dict.fromkeys(p.question1 for p in pairs))
    seen = set(firsts)
    return firsts, list(dict.fromkeys(p.question2 for p in pairs if p.question2 not in seen))


def _rows(hits: np.ndarray, right: np.ndarray, wanted: int, scores: np.ndarray) -> list[dict[str, float]]:
    rows = []
    for threshold in GRID:
        served = hits & (scores >= threshold)
        count = int(served.sum())
        rows.append({"threshold": threshold, "recall": float((served & right).sum() / max(wanted, 1)),
                     "wrong_hit_share": float((served & ~right).sum() / count) if count else 0.0, "hits": count})
    return rows


def oracle_curve(pairs: Sequence[LabelledPair], vectors: dict[str, np.ndarray], by_question: dict[str, int],
                 veto: Veto) -> list[dict[str, float]]:
    """Each pair alone (``shared`` and ``pairwise``): per threshold, the recall and wrong share of serving the first
    question's answer to the second wherever their cosine reaches it and no guard vetoes."""
    scores = np.array([float(np.dot(vectors[p.question1], vectors[p.question2])) for p in pairs])
    allowed = np.array([not veto(p.question2, p.question1) for p in pairs])
    right = np.array([same(p, by_question) for p in pairs])
    return _rows(allowed, right, int(right.sum()), scores)


def oracle_population_curve(pairs: Sequence[LabelledPair], vectors: dict[str, np.ndarray],
                            by_question: dict[str, int], veto: Veto, candidates: int = 4) -> list[dict[str, float]]:
    """One shared context (``population``): the same order replayed per threshold, each question matched like the
    proxy does (its ``candidates`` nearest stored questions, the most similar one no guard vetoes; stored: those that
    missed; the nearest among :data:`NEIGHBOURS` earlier questions stand in for the index), second questions
    counted."""
    firsts, seconds = population_order(pairs)
    order = firsts + seconds
    matrix = np.stack([vectors[q] for q in order])
    nearest = [np.argsort(-(matrix[:i] @ matrix[i]))[:NEIGHBOURS] if i else np.zeros(0, dtype=np.int64)
               for i in range(len(order))]
    vetoed: dict[tuple[int, int], bool] = {}
    wanted = sum(1 for q in seconds if any(by_question[q] == by_question[r] for r in firsts))
    rows = []
    for threshold in GRID:
        stored = np.zeros(len(order), dtype=bool)
        served = right = 0
        for i, question in enumerate(order):
            answer = None
            for j in [int(j) for j in nearest[i] if stored[j]][:candidates]:
                if float(matrix[j] @ matrix[i]) < threshold:
                    break
                if (i, j) not in vetoed:
                    vetoed[(i, j)] = veto(question, order[j])
                if not vetoed[(i, j)]:
                    answer = by_question[order[j]]
                    break
            if answer is None:
                stored[i] = True
            elif i >= len(firsts):
                served += 1
                right += answer == by_question[question]
        rows.append({"threshold": threshold, "recall": right / max(wanted, 1),
                     "wrong_hit_share": (served - right) / served if served else 0.0, "hits": served})
    return rows


def best_at(curve: Sequence[dict[str, float]], bound: float) -> dict[str, float] | None:
    """The hindsight oracle: the threshold with the highest recall whose wrong share is within ``bound``."""
    within = [row for row in curve if row["hits"] and row["wrong_hit_share"] <= bound]
    return max(within, key=lambda row: (row["recall"], -row["threshold"])) if within else None


def _spaces(question: str, rng: random.Random) -> str:
    words = question.split(" ")
    if not technical(question):  # technical text keeps its inner whitespace: only the ends are retyped there
        at = rng.randrange(len(words))
        words[at] = words[at] + rng.choice(("  ", "\t", " "))
    return rng.choice(("", " ", "  ", "\t")) + " ".join(words) + rng.choice(("", " ", "\n"))


def _question_marks(question: str, rng: random.Random) -> str:
    bare = question[:-1] if question.endswith("?") and question[-2:-1].isalnum() else question
    return bare + rng.choice(("", "?")) if bare[-1:].isalnum() else question


def _unicode(question: str, rng: random.Random) -> str:
    decomposed = unicodedata.normalize("NFD", question) if rng.random() < 0.5 else question
    typographic = decomposed.replace("'", "\u2019") if rng.random() < 0.5 else decomposed
    return typographic.replace(" ", "\u00a0", 1)


VARIANTS = (_unicode, _question_marks, _spaces)
"""In the order they apply (whitespace last, so it is what the user's keyboard left at the ends). Only retypings
that cannot change the answer: letter case and other punctuation can (``CO``/``Co``, ``5!``), so they are not
retypings but other questions, left to the semantic tier."""


def trivial_variants(question: str, count: int, rng: random.Random) -> list[str]:
    """``count`` retypings of ``question``, each changing one to three of: whitespace, a final question mark,
    Unicode forms (decomposed accents, a non-breaking space, a typographic apostrophe); none equal to the question
    itself."""
    found: list[str] = []
    for _ in range(count * 10):
        if len(found) == count:
            break
        variant = question
        chosen = rng.sample(range(len(VARIANTS)), rng.randint(1, 3))
        for change in (VARIANTS[i] for i in sorted(chosen)):
            variant = change(variant, rng)
        if variant != question and variant not in found:
            found.append(variant)
    return found
