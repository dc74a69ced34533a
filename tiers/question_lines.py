"""What two multi-line questions differ in, line by line: the lines the semantic tier's comparison must weigh.

The question compared by embedding leaves out the lines a namespace's template repeats
(:mod:`tiers.question_templates`), and embeds the lines it keeps as one text. Both can hide what tells two
requests apart: "What is the paracetamol dose?" followed by "The patient is a child." in one and "The patient is an
adult." in the other embeds close as a whole (the question line outweighs the qualifier), and at 1.0 once the
qualifier lines are template; a reworded question line with the other qualifier, the same. So before a candidate
serves, the two asked texts are compared line by line (lines folded for case and spacing, blank lines ignored): a
line both carry may be left out, a line where they differ may not.

- A line only one question carries (and none in its place in the other) vetoes the candidate (``lines``).
- When each compared text is exactly one differing line (a single-line question, or a template both carry around
  two question lines), the embedding compared what differs, and nothing more is asked.
- When the two compared texts share a line, or a differing line was left out of one as template, what differs is a
  qualifier of one shared question: a differing line with a content word (or number) the other question lacks
  vetoes the candidate (``lines``; "child" vs "adult", "metric" vs "imperial", "2010" vs "2024").
- Otherwise the differing lines are weighed on their own (:func:`lines_similarity`): each line against its closest
  counterpart among the other's differing lines, by their own embeddings; the candidate's similarity is the least
  of its compared texts' and of those lines' (a question is as close to another as its least close line), so a
  qualifier reworded along with its question is not carried by the question line.

The guards see each compared text with the differing lines it left out put back (:attr:`LineDiff.texts`). Pure:
the embeddings of the lines to weigh are computed by the caller (:attr:`LineDiff.weigh`), in one batch per lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tiers.answer_check import content_words


@dataclass(frozen=True, slots=True)
class LineDiff:
    """``veto``: why the candidate may not serve (``None``: it may, as far as its lines go); ``texts``: the two texts
    the guards compare; ``weigh``: each side's differing lines, when they must be weighed by their own embeddings
    (``((), ())`` when not)."""

    veto: str | None
    texts: tuple[str, str]
    weigh: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


def folded_lines(text: str) -> list[str]:
    """``text``'s non-blank lines, each with its spacing collapsed and case folded."""
    return [folded for line in text.split("\n") if (folded := _fold(line))]


def _fold(line: str) -> str:
    return " ".join(line.split()).casefold()


def diff_lines(asked: str, compared: str, other_asked: str, other_compared: str) -> LineDiff:
    """How a question (``asked``, embedded as ``compared``) and a candidate (``other_asked``, embedded as
    ``other_compared``) differ, line by line (module docstring)."""
    if "\n" not in asked and "\n" not in other_asked:  # single lines, compared as asked: the usual case
        return LineDiff(None, (compared, other_compared))
    mine, theirs = folded_lines(asked), folded_lines(other_asked)
    common = set(mine) & set(theirs)
    differ_mine = tuple(dict.fromkeys(line for line in mine if line not in common))
    differ_theirs = tuple(dict.fromkeys(line for line in theirs if line not in common))
    kept_mine, kept_theirs = set(folded_lines(compared)), set(folded_lines(other_compared))
    if (
        len(differ_mine) == len(differ_theirs) == 1
        and kept_mine == set(differ_mine)
        and kept_theirs == set(differ_theirs)
    ):
        return LineDiff(None, (compared, other_compared))
    texts = (
        _with_lines(asked, kept_mine | set(differ_mine)),
        _with_lines(other_asked, kept_theirs | set(differ_theirs)),
    )
    if not differ_mine and not differ_theirs:
        return LineDiff(None, texts)
    if not differ_mine or not differ_theirs:
        return LineDiff("lines: a line only one question carries", texts)
    hidden = not (set(differ_mine) <= kept_mine and set(differ_theirs) <= kept_theirs)
    if hidden or kept_mine & kept_theirs:
        for differ, other in ((differ_mine, other_asked), (differ_theirs, asked)):
            new = content_words("\n".join(differ)).keys() - content_words(other).keys()
            if new:
                return LineDiff(f"lines: {', '.join(sorted(new)[:3])} not in the other question", texts)
    return LineDiff(None, texts, (differ_mine, differ_theirs))


def lines_similarity(
    weigh: tuple[tuple[str, ...], tuple[str, ...]], vectors: Mapping[str, npt.NDArray[np.float32]]
) -> float | None:
    """The least, over every line to weigh, of its cosine with its closest counterpart on the other side (``None``
    when a line's embedding is missing from ``vectors``; 1 when there is nothing to weigh)."""
    mine, theirs = weigh
    if not mine or not theirs:
        return 1.0
    if any(line not in vectors for line in (*mine, *theirs)):
        return None
    left, right = (np.stack([_unit(vectors[line]) for line in side]) for side in (mine, theirs))
    cosines = left @ right.T
    return float(min(cosines.max(axis=1).min(), cosines.max(axis=0).min()))


def _unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


def _with_lines(text: str, keep: set[str]) -> str:
    """The lines of ``text`` whose folded form is in ``keep``, in order."""
    return "\n".join(line for line in text.split("\n") if _fold(line) in keep)
