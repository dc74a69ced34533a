"""Renumbering touches only citations: each answer shape, served to a prompt holding its documents in another order,
with the output expected (the citations rewritten, nothing else)."""

from __future__ import annotations

import pytest

from normalizer.documents import Document
from normalizer.evidence import evidence, renumbered, without_citations

A, B, C = Document("a", "Alpha text."), Document("b", "Beta text."), Document("c", "Gamma text.")
SEEN, NOW = (A, B, C), (C, A, B)
"""The cached answer saw a, b, c; the new prompt holds c, a, b: position 1 is now 2, 2 is 3, 3 is 1."""

SHAPES = [
    ("inline code", "Read `matrix[i][2]` as in [2].", "Read `matrix[i][2]` as in [3]."),
    ("index in prose", "Read matrix[i][2] and a[1] as in [2].", "Read matrix[i][2] and a[1] as in [3]."),
    ("JSON in a fenced block", 'Config [1]:\n```json\n{"ids": [1, 2], "m": [[1, 0], [0, 1]]}\n```\nDone [3].',
     'Config [2]:\n```json\n{"ids": [1, 2], "m": [[1, 0], [0, 1]]}\n```\nDone [1].'),
    ("Python in a fenced block", "```python\nv = [1, 2, 3]\nprint(v[2])\n```\nSee [1].",
     "```python\nv = [1, 2, 3]\nprint(v[2])\n```\nSee [2]."),
    ("Python list in prose", "With x = [1, 2, 3] the sum is 6 [3].", "With x = [1, 2, 3] the sum is 6 [1]."),
    ("a value announced", "sorted() returns [1, 2, 3] and the list [2, 3] stays [1].",
     "sorted() returns [1, 2, 3] and the list [2, 3] stays [2]."),
    ("matrix in prose", "The identity [[1, 0], [0, 1]] is standard [3].",
     "The identity [[1, 0], [0, 1]] is standard [1]."),
    ("interval", "p lies in [0, 1] [2].", "p lies in [0, 1] [3]."),
    ("interval past the documents", "Pick n in [1, 10] [2].", "Pick n in [1, 10] [3]."),
    ("odds", "The odds are [3:1] against [1].", "The odds are [3:1] against [2]."),
    ("LaTeX inline", "$x^{[2]}$ is layer two [2].", "$x^{[2]}$ is layer two [3]."),
    ("LaTeX display", "$$A = [1, 2]$$ per [1].", "$$A = [1, 2]$$ per [2]."),
    ("TeX delimiters", r"\(v_{[1]}\) and \[w = [3]\] from [2].", r"\(v_{[1]}\) and \[w = [3]\] from [3]."),
    ("JSON in prose", 'It returns {"scores": [1, 2]} [1].', 'It returns {"scores": [1, 2]} [2].'),
    ("Markdown around citations", "| dose | [1] |\n> **[2]**\n- [3] item", "| dose | [2] |\n> **[3]**\n- [1] item"),
    ("prices are not maths", "It costs $5 [1] and $10 [2].", "It costs $5 [2] and $10 [3]."),
    ("citations", "Beta [2][3], gamma [Source 3; doc 1], 【1】 and [b].",
     "Beta [3][1], gamma [Source 1; doc 2], 【2】 and [b]."),
]


@pytest.mark.parametrize(("shape", "answer", "expected"), SHAPES, ids=[shape for shape, _, _ in SHAPES])
def test_only_citations_are_renumbered(shape: str, answer: str, expected: str) -> None:
    assert renumbered(answer, evidence(answer, SEEN), NOW) == expected, shape


@pytest.mark.parametrize(("shape", "answer", "expected"), SHAPES, ids=[shape for shape, _, _ in SHAPES])
def test_only_citations_are_left_out_of_the_compared_answer(shape: str, answer: str, expected: str) -> None:
    """Two answers are compared without their citations: the same spans renumbering reads, nothing else."""
    stripped = without_citations(answer)
    assert without_citations(expected) == stripped, shape
    for kept in ("matrix[i][2]", "[0, 1]", "[3:1]", "$x^{[2]}$", "[1, 2, 3]", '{"scores": [1, 2]}'):
        assert (kept in answer) <= (kept in stripped), (shape, kept)


def test_what_is_not_a_citation_is_no_evidence() -> None:
    kept = evidence("With x = [1, 2, 3], in [0, 1], odds [3:1], `m[2]`, $x^{[2]}$.", SEEN)
    assert kept is not None and kept["cited"] is None and not kept["rests_on"]
