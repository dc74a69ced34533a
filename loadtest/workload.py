"""Paraphrase workloads for the semantic tier, built from real questions (NQ-open, ``../shared/data``).

A workload is a set of **cached** questions (what earlier users asked and the cache stored) and a shuffled
list of **probes** (what later users ask), each labelled with the cached question it is equivalent to, if
any:

- ``prefix``: the question behind one of four textual prefixes ("Tell me ", "I want to know ", ...), as in the
  Proximity paper's workload;
- ``rephrase``: a genuine rewording by rule: question-word swaps ("when did" → "what year did", "who wrote" →
  "who is the author of", "how many" → "what number of"...), contractions ("what is" ↔ "what's"), and polite
  wrappers ("can you tell me ...?", "do you know ...?");
- ``near_miss_entity`` / ``near_miss_number`` / ``near_miss_negation``: the same template with one content
  word swapped for a content word of another question, a number changed ("season 5" → "season 7", "2017" →
  "2015"), or a "not" after the question's first auxiliary verb ("where was not percy jackson ... filmed"). These
  ask something else and must NOT hit;
- ``unseen``: a held-out question (and its variants) whose equivalent was never cached: must not hit either.

Everything is deterministic for a given seed. NQ-open is lower-case and unpunctuated; variants keep that
style apart from the wrappers' capital letters and question marks.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loadtest.responses import DEFAULT_QUESTIONS

DATA = DEFAULT_QUESTIONS

PREFIXES = ("Tell me ", "I want to know ", "Please tell me ", "I would like to know ")

ProbeKind = Literal["prefix", "rephrase", "near_miss_entity", "near_miss_number", "near_miss_negation", "unseen"]

_REWRITES: tuple[tuple[str, str], ...] = (
    (r"^what is ", "what's "),
    (r"^what's ", "what is "),
    (r"^who is ", "who's "),
    (r"^where is ", "where's "),
    (r"^when did ", "what year did "),
    (r"^when was ", "in what year was "),
    (r"^who wrote ", "who is the author of "),
    (r"^who sings ", "who is the singer of "),
    (r"^who sang ", "who was the singer of "),
    (r"^who plays ", "which actor plays "),
    (r"^who played ", "which actor played "),
    (r"^who won ", "who was the winner of "),
    (r"^how many ", "what number of "),
    (r"^when does ", "when will "),
    (r"^where does ", "where exactly does "),
    (r"^what does (.+) mean$", r"what is the meaning of \1"),
    (r"^what is the meaning of (.+)$", r"what does \1 mean"),
)
_WRAPPERS = ("can you tell me {q}?", "do you know {q}?", "{Q}?", "i'd like to find out {q}")

_STOP_WORDS = frozenset(
    re.findall(
        r"\S+",
        """a an the of in on at to for from by with and or but is are was were be been being do does did has have
    had who whom whose what which when where why how many much that this these those it its it's there their
    they them he she his her him we you your i me my our us as into about after before during over under
    between up down out off than then so not no yes will would can could should shall may might must last
    first year years time come came comes go goes went get got make made take took play plays played""",
    )
)
_NUMBER = re.compile(r"\b\d+\b")
_NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


@dataclass(frozen=True, slots=True)
class Probe:
    """A question a later user asks; ``source`` is the cached question it is equivalent to (``None``: none)."""

    text: str
    kind: ProbeKind
    source: str | None
    derived_from: str

    @property
    def expect_hit(self) -> bool:
        return self.source is not None


@dataclass(frozen=True, slots=True)
class SemanticWorkload:
    """Questions to cache first, then probes to look up (shuffled)."""

    cached: list[str]
    probes: list[Probe]

    def count(self, kind: ProbeKind) -> int:
        return sum(probe.kind == kind for probe in self.probes)


def load_questions(path: Path = DATA, limit: int | None = None) -> list[str]:
    """The distinct questions of an NQ-open JSONL file, in file order."""
    questions: dict[str, None] = {}
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                questions[" ".join(json.loads(line)["question"].split())] = None
            if limit is not None and len(questions) >= limit:
                break
    return list(questions)


def prefix_variants(question: str) -> list[str]:
    """The question behind each of the four prefixes."""
    return [prefix + question for prefix in PREFIXES]


def rephrasings(question: str, rng: random.Random, wrappers: int = 2) -> list[str]:
    """The applicable rule-based rewrite (at most one) and ``wrappers`` polite wrappings."""
    found: list[str] = []
    for pattern, replacement in _REWRITES:
        rewritten = re.sub(pattern, replacement, question)
        if rewritten != question:
            found.append(rewritten)
            break
    for template in rng.sample(_WRAPPERS, k=min(wrappers, len(_WRAPPERS))):
        found.append(template.format(q=question, Q=question[:1].upper() + question[1:]))
    return found


def _content_positions(words: Sequence[str]) -> list[int]:
    return [i for i, word in enumerate(words) if len(word) >= 4 and word.isalpha() and word not in _STOP_WORDS]


def entity_near_miss(question: str, pool: Sequence[str], rng: random.Random) -> str | None:
    """The question with its last content word replaced by a content word of another question."""
    words = question.split()
    positions = _content_positions(words)
    if not positions:
        return None
    position = positions[-1]
    for _ in range(20):
        other = pool[rng.randrange(len(pool))].split()
        choices = [other[i] for i in _content_positions(other) if other[i] != words[position]]
        if choices:
            replaced = [*words[:position], rng.choice(choices), *words[position + 1 :]]
            return " ".join(replaced)
    return None


def number_near_miss(question: str, rng: random.Random) -> str | None:
    """The question with one number changed (digits or a number word), or ``None`` if it has none."""
    digits = list(_NUMBER.finditer(question))
    if digits:
        match = rng.choice(digits)
        value = int(match.group())
        delta = rng.choice([d for d in range(-5, 6) if d and value + d >= 0])
        return question[: match.start()] + str(value + delta) + question[match.end() :]
    words = question.split()
    spelled = [i for i, word in enumerate(words) if word in _NUMBER_WORDS]
    if not spelled:
        return None
    position = rng.choice(spelled)
    words[position] = rng.choice([w for w in _NUMBER_WORDS if w != words[position]])
    return " ".join(words)


_AUXILIARY = re.compile(r"^((?:\S+ ){0,2}?(?:is|are|was|were|does|did|do|can|will|has|have|had) )")


def negation_near_miss(question: str) -> str | None:
    """The question with "not" after its first auxiliary verb (within its first three words), or ``None``."""
    match = _AUXILIARY.match(question)
    return None if match is None else question[: match.end()] + "not " + question[match.end() :]


def build_workload(
    questions: Sequence[str],
    *,
    cached_fraction: float = 0.8,
    seed: int = 0,
) -> SemanticWorkload:
    """Cache ``cached_fraction`` of ``questions``; probe with variants, near misses and unseen questions."""
    rng = random.Random(seed)
    shuffled = list(questions)
    rng.shuffle(shuffled)
    split = int(len(shuffled) * cached_fraction)
    cached, unseen = shuffled[:split], shuffled[split:]
    known = set(questions)
    probes: list[Probe] = []
    for question in cached:
        probes += [Probe(text, "prefix", question, question) for text in prefix_variants(question)]
        probes += [Probe(text, "rephrase", question, question) for text in rephrasings(question, rng)]
        entity = entity_near_miss(question, shuffled, rng)
        if entity is not None and entity not in known:
            probes.append(Probe(entity, "near_miss_entity", None, question))
        number = number_near_miss(question, rng)
        if number is not None and number not in known:
            probes.append(Probe(number, "near_miss_number", None, question))
        negated = negation_near_miss(question)
        if negated is not None and negated not in known:
            probes.append(Probe(negated, "near_miss_negation", None, question))
    for question in unseen:
        texts = [question, rng.choice(prefix_variants(question)), *rephrasings(question, rng, wrappers=1)]
        probes += [Probe(text, "unseen", None, question) for text in texts]
    rng.shuffle(probes)
    return SemanticWorkload(cached=cached, probes=probes)
