"""Answers a namespace's upstream gave word for word to several distinct questions: fixed replies, not evidence.

An answer that comes back unchanged whatever the question ("ACK", "1 2 3 4 5", ``{"status": "ok"}``, a fixed
paragraph a system prompt dictates) agrees with itself for any two look-alike questions, so its agreements say
nothing about whether those questions need one answer (docs/semantic.md, "What one user of a tenant can do"). Per
namespace (``<tenant>\\x1f<namespace>``, as templates are learnt), each answer the upstream gave (its words, folded
for case and punctuation) is kept with up to :data:`REPEATED` of the distinct questions (folded for case and
spacing) it answered; an answer given to :data:`REPEATED` of them is a fixed reply, and an agreement of one is not
counted (:meth:`~tiers.semantic.SemanticTier.compare`). A namespace keeps its last :data:`ANSWERS` answers; what
the namespaces hold stays within ``cache.l2.replies_max_bytes`` (:data:`NAMESPACE_BYTES`, :data:`ANSWER_BYTES`):
beyond it, the least recently used namespace of the tenant holding the most is forgotten
(:class:`~tiers.budgets.OwnedLRU`). Learnt per process. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from tiers.budgets import MemoryAccount, OwnedLRU

REPEATED = 3
"""Distinct questions an answer must have been given to, word for word, to be a fixed reply."""
ANSWERS = 256
"""Answers kept per namespace (the oldest forgotten first)."""
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""``cache.l2.replies_max_bytes``: about 160 namespaces at their fullest (256 answers: 52 KB), thousands holding a few
answers."""
NAMESPACE_BYTES = 600
"""A namespace's objects beyond its answers: its ordered map, its place in the budget, its name."""
ANSWER_BYTES = 200
"""One answer kept: its hash, a tuple of up to :data:`REPEATED` question hashes, its place in the map
(tracemalloc: ``tests/tiers/test_repeated_answers.py``)."""

_WORD = re.compile(r"[^\W_]+")


def answer_digest(answer: str) -> int:
    """An answer's identity: its words, case folded (punctuation and spacing aside)."""
    return hash(" ".join(_WORD.findall(answer.casefold())))


def question_digest(question: str) -> int:
    """A question's identity: its text with spacing collapsed and case folded."""
    return hash(" ".join(question.split()).casefold())


class RepeatedAnswers:
    """Per namespace, which answers were given to :data:`REPEATED` distinct questions (module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._answers: dict[str, OrderedDict[int, tuple[int, ...]]] = {}
        self._kept: OwnedLRU[str] = OwnedLRU()

    def memory(self) -> list[MemoryAccount]:
        return [
            MemoryAccount("l2_replies", self._kept.bytes, self.max_bytes, len(self._kept), "cache.l2.replies_max_bytes")
        ]

    def learn(self, namespace: str, question: str, answer: str) -> None:
        """``answer`` was given to ``question`` in ``namespace`` (``<tenant>\\x1f<namespace>``)."""
        answers = self._answers.get(namespace)
        if answers is None:
            answers = self._answers[namespace] = OrderedDict()
        key, asked = answer_digest(answer), question_digest(question)
        questions = answers.pop(key, ())
        answers[key] = questions if asked in questions or len(questions) >= REPEATED else (*questions, asked)
        while len(answers) > ANSWERS:
            answers.popitem(last=False)
        self._kept.set(
            namespace, namespace.split("\x1f", 1)[0], NAMESPACE_BYTES + len(namespace) + ANSWER_BYTES * len(answers)
        )
        while self._kept.bytes > self.max_bytes:
            victim = self._kept.victim(keep=namespace)
            victim = namespace if victim is None else victim
            self._kept.remove(victim)
            del self._answers[victim]

    def repeated(self, namespace: str, answer: str) -> bool:
        """Whether ``answer`` was given to :data:`REPEATED` distinct questions of ``namespace``."""
        answers = self._answers.get(namespace)
        return answers is not None and len(answers.get(answer_digest(answer), ())) >= REPEATED
