"""The lines an app's prompt template repeats around each question, learnt per partition and left out of the
question the semantic tier compares.

RAG apps often send the question inside a template in the same message as the documents ("Use the sources below
... Sources: [1] ... [2] ... Question: <q> Answer:"). With the documents cut out, what is left is mostly template,
the same words in every request: embedded whole, every two questions look alike, the cosine cells no longer mean
what the calibration prior says, and the namespace stays calibrating. So the lines a partition's recent questions
repeat are taken for template and dropped from the question that is embedded.

Per partition (tenant, namespace, context signature), the line hashes of the last :data:`WINDOW` distinct question
texts are kept; a line is template when more than half of them, and at least two, carry it. What remains, joined,
is the question; a text that would be left empty (a hot question repeated more often than the template itself, a
single-line question) stays whole. Partitions beyond ``partitions`` are forgotten least recently used first, so
memory is bounded by ``partitions x WINDOW x MAX_LINES`` hashes. Learnt per process: replicas learn the same
templates from their own traffic.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

WINDOW = 16
"""Distinct question texts a partition's template is read from."""
MAX_LINES = 64
"""Lines of one text taken into account (the rest are kept as question)."""


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


class QuestionTemplates:
    """Template lines learnt per partition (module docstring)."""

    def __init__(self, partitions: int = 4096) -> None:
        self.partitions = max(1, partitions)
        self._recent: OrderedDict[str, _Recent] = OrderedDict()

    def question(self, partition: str, text: str) -> str:
        """``text`` without the lines ``partition``'s template repeats (learning from it first)."""
        lines = text.split("\n")
        if len(lines) < 2:
            return text
        hashes = [hash(line) for line in lines[:MAX_LINES]]
        recent = self._recent.get(partition)
        if recent is None:
            recent = self._recent[partition] = _Recent()
            while len(self._recent) > self.partitions:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(partition)
        recent.learn(frozenset(hashes))
        need = max(2, len(recent.texts) // 2 + 1)
        kept = [line for i, line in enumerate(lines) if i >= MAX_LINES or recent.counts[hashes[i]] < need]
        return " ".join(kept) if kept else " ".join(lines)
