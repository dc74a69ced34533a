"""Whether two answers say the same thing, whatever their wording: the comparison that turns a forwarded request into
evidence for the L2 decision (:mod:`tiers.calibration`).

A sampling model words two answers to one question differently, and answers to look-alike questions share their
topic, boilerplate and structure: the check must look past both. It compares content words weighted by how rare
they are among the upstream's answers, leaving out the words of both questions. Its errors both ways and what they
do to the bound: docs/semantic.md; measured on sampled answers: BENCHMARKS.md. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

_TOKEN = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)?")
_FUNCTION_WORDS = frozenset((
    "a", "an", "the", "of", "to", "in", "on", "at", "for", "by", "with", "from", "and", "or", "but", "nor", "is",
    "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "done", "has", "have", "had", "having",
    "it", "its", "this", "that", "these", "those", "there", "here", "you", "your", "yours", "i", "me", "my", "mine",
    "we", "us", "our", "they", "them", "their", "he", "him", "his", "she", "her", "hers", "as", "so", "if", "then",
    "than", "too", "very", "can", "could", "would", "should", "will", "shall", "may", "might", "must", "not", "no",
    "yes", "what", "which", "who", "whom", "whose", "how", "why", "when", "where", "just", "also", "about", "into",
    "over", "under", "up", "down", "out", "more", "most", "some", "any", "all", "each", "both", "few", "one",
    "ones", "such", "own", "same", "other", "only", "again", "once"
))  # fmt: skip
MAX_DOCUMENTS = 20_000
"""Words whose answer counts :class:`AnswerAgreement` keeps before it halves them all (old answers fade)."""
MIN_ANSWERS = 20
"""Answers :class:`AnswerAgreement` must have seen before its verdicts count as evidence."""
SHORT_ANSWER_WORDS = 3
"""An answer of at most this many distinct words tells nothing about whether its question and a look-alike need one
answer ("ACK", "Yes.", "OK, done": :func:`uninformative`)."""
MIN_INFORMATIVE_WORDS = 1
"""Distinct words an answer must carry that its request did not (:func:`informative_words`) for an agreement to be
evidence (:func:`uninformative`); more would drop honest short answers ("Paris is the capital of France.")."""


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def content_words(text: str, leave_out: Iterable[str] = ()) -> Counter[str]:
    """Lower-cased, plural ``s`` dropped, function words and ``leave_out`` (already so folded) left out."""
    skip = set(leave_out)
    return Counter(stem for word in _TOKEN.findall(text.casefold()) if word not in _FUNCTION_WORDS
                   and (stem := _stem(word)) not in skip)


class AnswerAgreement:
    """Whether two answers say the same thing, whatever their wording: the cosine of their TF-IDF vectors over
    content words, leaving out the words of both questions (an answer repeats its question's words, so they tell
    nothing about what it answers), at least ``cut``.

    Word weights come from the answers the upstream gave so far (:meth:`learn`: a word in most answers, like an
    answer's stock phrases, weighs nothing; one that names what an answer says weighs much), so the check adapts to
    how the upstream writes; it gives no verdict before :data:`MIN_ANSWERS` answers (:attr:`ready`). Why not
    embeddings of the whole answers: two answers on one topic embed close whether or not they say
    the same thing, and two samples of one answer less close than their content warrants (BENCHMARKS.md, "Varied
    answers"). Errors both ways are measured there; how each affects the bound: docs/semantic.md."""

    def __init__(self, cut: float) -> None:
        self.cut = cut
        self._documents: Counter[str] = Counter()
        self._seen = 0

    @property
    def ready(self) -> bool:
        """Whether enough answers were seen (:data:`MIN_ANSWERS`) for the word weights to mean something; before,
        a verdict would mostly measure the upstream's stock phrases."""
        return self._seen >= MIN_ANSWERS

    def learn(self, answer: str) -> None:
        """Count the words of one answer the upstream gave (every stored answer passes here once)."""
        self._documents.update(content_words(answer).keys())
        self._seen += 1
        if len(self._documents) > MAX_DOCUMENTS:
            self._documents = Counter({w: n // 2 for w, n in self._documents.items() if n > 1})
            self._seen //= 2

    def similarity(self, cached: str, fresh: str, questions: Sequence[str] = ()) -> float:
        """The TF-IDF cosine of the two answers' content words, those of ``questions`` left out (1 for equal texts
        up to whitespace and case)."""
        if answers_agree_exactly(cached, fresh):
            return 1.0
        asked = {_stem(w) for q in questions for w in _TOKEN.findall(q.casefold())}
        vectors = [{w: (1 + math.log(n)) * self._weight(w) for w, n in content_words(text, asked).items()}
                   for text in (cached, fresh)]
        dot = sum(weight * vectors[1].get(word, 0.0) for word, weight in vectors[0].items())
        norms = math.sqrt(sum(v * v for v in vectors[0].values()) * sum(v * v for v in vectors[1].values()))
        return dot / norms if norms else 0.0

    def agree(self, cached: str, fresh: str, questions: Sequence[str] = ()) -> bool:
        return self.similarity(cached, fresh, questions) >= self.cut

    def _weight(self, word: str) -> float:
        return math.log((self._seen + 1) / (self._documents.get(word, 0) + 1))


def answers_agree_exactly(cached: str, fresh: str) -> bool:
    """Whether two answers are the same text up to whitespace and case."""
    return " ".join(cached.split()).casefold() == " ".join(fresh.split()).casefold()


def informative_words(answer: str, prompts: Iterable[str] = ()) -> set[str]:
    """The words of ``answer`` its request did not dictate: content words with a letter in them (a number alone can
    be dictated in words: "the digits one to five") that no text of ``prompts`` (the two questions, the system
    prompt, the instructions, the earlier turns) carries."""
    asked = {_stem(word) for prompt in prompts for word in _TOKEN.findall(prompt.casefold())}
    return {word for word in content_words(answer, asked) if not word.isdigit() and any(c.isalpha() for c in word)}


def uninformative(cached: str, fresh: str, prompts: Sequence[str] = ()) -> bool:
    """Whether two answers tell nothing about whether their questions need one answer: either is very short (at most
    :data:`SHORT_ANSWER_WORDS` distinct words: "ACK", "Yes.", "OK, done"), or carries fewer than
    :data:`MIN_INFORMATIVE_WORDS` word its request did not dictate (:func:`informative_words`: "1 2 3 4 5" for "the
    digits one to five", the fixed JSON or the phrase the prompt spells out, "Understood." where it says to reply
    so). Two such answers agree or not as the instruction says, whatever the questions ask: counting their agreement
    would let anyone who can send look-alike questions lower a namespace's threshold for everyone (docs/semantic.md,
    "What one user of a tenant can do"). Answers the upstream gave word for word to several distinct questions are
    the other case (:class:`tiers.repeated_answers.RepeatedAnswers`)."""
    return any(len(set(_TOKEN.findall(answer.casefold()))) <= SHORT_ANSWER_WORDS
               or len(informative_words(answer, prompts)) < MIN_INFORMATIVE_WORDS for answer in (cached, fresh))
