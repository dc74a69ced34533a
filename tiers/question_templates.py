"""The lines an app's prompt template repeats around each question, learnt per namespace and left out of the
question the semantic tier compares.

RAG apps often send the question inside a template in the same message as the documents ("Use the sources below
... Sources: [1] ... [2] ... Question: <q> Answer:"). With the documents cut out, what is left is mostly template,
the same words in every request: embedded whole, every two questions look alike, the cosine cells no longer mean
what the calibration prior says, and the namespace stays calibrating. So the lines a partition's recent questions
repeat are taken for template and dropped from the question that is embedded.

Per namespace (a tenant's, or a user's in a private one: an app's template spans its contexts), the line hashes of
the last :data:`WINDOW` distinct question texts are kept (a text repeated counts once); a line is template when at
least a quarter of them, and at least two, carry it, so two templates in turn are both learnt, and a question's own
line counts only when it comes back around other lines. What remains, joined, is the question; a text that would be
left empty (a single-line question is never split) stays whole. The first question of a namespace is compared whole:
nothing is known to repeat yet. Namespaces beyond ``namespaces`` are forgotten least recently used first, so memory
is bounded (:data:`NAMESPACES`). Learnt per process: replicas learn the same templates from
their own traffic.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

WINDOW = 16
"""Distinct question texts a partition's template is read from."""
MAX_LINES = 32
"""Lines of one text taken into account (the rest are kept as question)."""
NAMESPACES = 256
"""Namespaces learnt at once (least recently used forgotten first): at most about 75 KB each (16 texts of 32 line
hashes and their counts, measured with tracemalloc), so about 19 MB in all, whatever namespaces clients name."""


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
    """Template lines learnt per namespace (module docstring)."""

    def __init__(self, namespaces: int = NAMESPACES) -> None:
        self.namespaces = max(1, namespaces)
        self._recent: OrderedDict[str, _Recent] = OrderedDict()

    def question(self, namespace: str, text: str) -> str:
        """``text`` without the lines ``namespace``'s template repeats (learning from it first)."""
        lines = text.split("\n")
        if len(lines) < 2:
            return text
        hashes = [hash(line) for line in lines[:MAX_LINES]]
        recent = self._recent.get(namespace)
        if recent is None:
            recent = self._recent[namespace] = _Recent()
            while len(self._recent) > self.namespaces:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(namespace)
        recent.learn(frozenset(hashes))
        need = max(2, len(recent.texts) // 4)
        kept = [line for i, line in enumerate(lines) if i >= MAX_LINES or recent.counts[hashes[i]] < need]
        return " ".join(kept) if kept else " ".join(lines)
