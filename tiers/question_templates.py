"""The lines an app's prompt template repeats around each question, learnt per namespace and left out of the
question the semantic tier compares.

RAG apps often send the question inside a template in the same message as the documents ("Use the sources below
... Sources: [1] ... [2] ... Question: <q> Answer:"). With the documents cut out, what is left is mostly template,
the same words in every request: embedded whole, every two questions look alike, the cosine cells no longer mean
what the calibration prior says, and the namespace stays calibrating. So the lines a partition's recent questions
repeat are taken for template and dropped from the question that is embedded.

Per namespace (a tenant's, or a user's in a private one: an app's template spans its contexts), the hashes of the
lines (spacing collapsed, case folded) of
the last :data:`WINDOW` distinct question texts are kept (a text repeated counts once); a line is template when at
least a quarter of them, and at least two, carry it, so two templates in turn are both learnt, and a question's own
line counts only when it comes back around other lines. What remains, its lines as they were, is the question; a
text that would be left empty (a single-line question is never split) stays whole. A line is left out of the
question compared, not of the comparison: where two questions differ in a line, template or not, the semantic tier
compares that line too before serving (:mod:`tiers.question_lines`). The first question of a namespace is compared
whole: nothing is known to repeat yet. What the namespaces hold is kept within a byte budget
(``cache.l2.templates_max_bytes``; each namespace's own size, :meth:`_Recent.nbytes`): beyond it, the least recently
used namespace of the tenant holding the most is forgotten (:class:`~tiers.budgets.OwnedLRU`). Learnt per process:
replicas learn the same templates from their own traffic.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from dataclasses import dataclass, field

from tiers.budgets import MemoryAccount, OwnedLRU

WINDOW = 16
"""Distinct question texts a partition's template is read from."""
MAX_LINES = 32
"""Lines of one text taken into account (the rest are kept as question)."""
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""``cache.l2.templates_max_bytes``: at least 200 namespaces at their largest (16 texts of 32 distinct lines: about
75 KB), thousands of an app's usual few template lines."""
NAMESPACE_BYTES = 400
"""A namespace's objects beyond its texts and counts: its window, its place in the budget, its name's header."""
_HASH_BYTES = 36
"""A line hash (a 64-bit ``int`` object), counted once however many texts carry it."""


@dataclass(slots=True)
class _Recent:
    texts: deque[frozenset[int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    counts: Counter[int] = field(default_factory=Counter)
    """Line hash → how many of ``texts`` carry it (no zero entries)."""

    def learn(self, lines: frozenset[int]) -> None:
        if lines in self.texts:
            return
        if len(self.texts) == WINDOW:
            for line in self.texts[0]:
                self.counts[line] -= 1
                if not self.counts[line]:
                    del self.counts[line]
        self.texts.append(lines)
        self.counts.update(lines)

    def nbytes(self) -> int:
        """What it holds (the sizes of its containers and line hashes)."""
        return (NAMESPACE_BYTES + sys.getsizeof(self.counts) + _HASH_BYTES * len(self.counts)
                + sum(sys.getsizeof(text) for text in self.texts))


class QuestionTemplates:
    """Template lines learnt per namespace (module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._recent: dict[str, _Recent] = {}
        self._kept: OwnedLRU[str] = OwnedLRU()

    def memory(self) -> list[MemoryAccount]:
        return [MemoryAccount("l2_templates", self._kept.bytes, self.max_bytes, len(self._kept),
                              "cache.l2.templates_max_bytes")]

    def question(self, namespace: str, text: str) -> str:
        """``text`` without the lines ``namespace``'s template repeats (learning from it first); ``namespace``:
        ``<tenant>\\x1f<namespace>``, the tenant owning it in the budget."""
        lines = text.split("\n")
        if len(lines) < 2:
            return text
        hashes = [hash(" ".join(line.split()).casefold()) for line in lines[:MAX_LINES]]
        recent = self._recent.get(namespace)
        if recent is None:
            recent = self._recent[namespace] = _Recent()
        recent.learn(frozenset(hashes))
        self._kept.set(namespace, namespace.split("\x1f", 1)[0], recent.nbytes() + sys.getsizeof(namespace))
        while self._kept.bytes > self.max_bytes:
            victim = self._kept.victim(keep=namespace)
            victim = namespace if victim is None else victim
            self._kept.remove(victim)
            del self._recent[victim]
        need = max(2, len(recent.texts) // 4)
        kept = [line for i, line in enumerate(lines) if i >= MAX_LINES or recent.counts[hashes[i]] < need]
        return "\n".join(kept) if kept else text
