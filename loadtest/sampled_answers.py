"""Answers worded like a sampling LLM's: a stand-in for a real model in the fidelity benchmark (``--answers varied``).

What a sampling LLM does that a fixed answer per question does not, and how this module does it:

- **what it says depends on what was asked** (the meaning): each cluster of questions that one answer serves has
  its own two *points* (:func:`cluster_points`: an advice, a reason and an example with a number, drawn from word
  lists), seeded by the cluster alone. Two questions of one cluster get the same points; two look-alike questions
  of different clusters get different ones. A third, general point is seeded by the question's longest content word
  (:func:`topic_point`): look-alike questions often share it, and two wordings of one question may not.
- **how it says it changes with every call** (the sampling): each call draws a fresh opening, a fresh template and
  synonyms for every point, the points' order, whether a point comes with its reason and its example, and a closing
  (:meth:`SampledAnswers.answer`, its own random generator per call).
- **it repeats the question's own words**: the opening and the points are written around the question's content
  words (:func:`topic`), so answers to look-alike questions share their topic words, structure and boilerplate,
  and answers to two wordings of one question do not share all of them.

It is written from these three observations about sampled answers, not from the rule the proxy uses to judge
whether two answers agree (:class:`tiers.answer_check.AnswerAgreement`): that rule sees only the texts, and this module
decides nothing about how close two texts come under it. BENCHMARKS.md reports how often that rule errs each way
on these answers.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass

_STOP = frozenset((
    "a", "an", "the", "of", "to", "in", "on", "at", "for", "by", "with", "from", "and", "or", "but", "is", "are",
    "was", "were", "be", "been", "being", "do", "does", "did", "has", "have", "had", "what", "which", "who", "whom",
    "whose", "when", "where", "why", "how", "that", "this", "these", "those", "it", "its", "there", "their", "they",
    "them", "he", "she", "his", "her", "him", "we", "you", "your", "i", "me", "my", "our", "us", "as", "into",
    "about", "so", "than", "then", "can", "could", "would", "should", "will", "shall", "may", "might", "must",
    "not", "no", "any", "some", "more", "most", "much", "many", "very", "just", "also", "if", "whether", "way",
    "ways", "best", "good", "get", "make", "one", "people", "someone", "something", "things", "thing", "like",
    "really", "know"
))  # fmt: skip

_ACTIONS = ("start with", "focus on", "avoid", "compare", "look for", "read about", "practise", "keep track of",
            "ask about", "invest in", "set aside time for", "write down", "check", "plan for", "cut back on",
            "learn", "try", "measure", "review", "talk to someone about")
_OBJECTS = ("the basics", "a daily routine", "small projects", "official documentation", "a mentor", "sleep",
            "your budget", "online courses", "local regulations", "customer reviews", "the warranty", "protein",
            "practice tests", "open-source code", "a notebook", "the fundamentals of grammar", "public transport",
            "interest rates", "hydration", "posture", "the community forums", "feedback", "a written plan",
            "free trials", "the return policy", "battery life", "privacy settings", "the syllabus", "past papers",
            "a support group", "your network", "the fine print", "market prices", "basic statistics",
            "safety gear", "a checklist", "the history of the field", "primary sources", "a second opinion",
            "your own goals", "long walks", "a spreadsheet", "the user manual", "backup copies", "shortcuts",
            "seasonal discounts", "the exchange rate", "vaccination records", "a portfolio", "cover letters")
_REASONS = ("it saves money in the long run", "it builds confidence", "most beginners underestimate it",
            "it is what examiners look at first", "it prevents common mistakes", "results show up quickly",
            "it depends on where you live", "it keeps you motivated", "experts disagree about the rest",
            "it is hard to undo later", "it scales well", "the risks are low", "it is cheap to try",
            "it makes later steps easier", "it is often overlooked", "it affects your health directly",
            "employers ask about it", "it changes every year", "it is the safest option",
            "it works for most people")
_EXAMPLES = ("a friend of mine", "many students", "small businesses", "first-time buyers", "travellers",
             "retirees", "new parents", "software teams", "athletes", "freelancers", "teachers", "engineers",
             "musicians", "researchers", "shop owners", "nurses", "gamers", "investors", "writers", "farmers")
_UNITS = ("weeks", "months", "hours a week", "percent", "dollars", "minutes a day", "steps", "years")

_OPENINGS = ("Good question about {t}.", "When it comes to {t}, a few things matter.", "Here is how I would think "
             "about {t}.", "There are a few points on {t}.", "Short answer on {t}: it depends, but here is the gist.",
             "Let me break down {t}.", "{T}: here is what usually works.", "People often ask about {t}.")
_ADVICE = ("First, {a} {o}.", "For {t}, you should {a} {o}.", "It helps to {a} {o}.", "My advice on {t}: {a} {o}.",
           "A good first step with {t} is to {a} {o}.", "Make sure you {a} {o}.", "With {t}, try to {a} {o} early on.")
_WHY = ("This matters because {r}.", "The reason is that {r}.", "Why? Because {r}.", "{R}, after all.",
        "Keep in mind that {r}.", "Remember, {r}.")
_EXAMPLE = ("For example, {e} usually need about {n} {u}.", "{E} typically spend around {n} {u} on this.",
            "In practice, {e} report roughly {n} {u}.", "As an example, {e} tend to need {n} {u}.")
_HEDGES = ("Of course, everyone's situation is different.", "Your mileage may vary.", "This is general advice.",
           "It is worth checking with an expert too.", "Hope this helps!", "Good luck with it.", "")
_SYNONYMS = {"usually": ("usually", "typically", "generally"), "roughly": ("roughly", "around", "approximately"),
             "need": ("need", "require"), "helps": ("helps", "pays"), "matters": ("matters", "counts")}
_WORD = re.compile(r"[A-Za-z][A-Za-z'+#-]*")


def topic(question: str) -> str:
    """The question's content words in their order (at most five), as an answer would repeat them."""
    words = [w.lower() for w in _WORD.findall(question) if w.lower() not in _STOP and len(w) > 2]
    return " ".join(words[:5]) or "this"


@dataclass(frozen=True, slots=True)
class Point:
    """One thing an answer says: an advice (action and object), the reason for it, and an example with a number."""

    action: str
    obj: str
    reason: str
    example: str
    number: int
    unit: str


def _points(seed: str, count: int) -> tuple[Point, ...]:
    rng = random.Random(zlib.crc32(seed.encode()))
    return tuple(Point(rng.choice(_ACTIONS), rng.choice(_OBJECTS), rng.choice(_REASONS), rng.choice(_EXAMPLES),
                       rng.randint(2, 40), rng.choice(_UNITS)) for _ in range(count))


def cluster_points(cluster: int, count: int = 2) -> tuple[Point, ...]:
    """The points every answer to a question of ``cluster`` makes (seeded by the cluster alone)."""
    return _points(f"cluster/{cluster}", count)


def topic_point(question: str) -> Point:
    """The general point a model makes about the question's longest content word, whatever the question asks
    exactly: look-alike questions share it, two wordings of one question share it only when that word is the same."""
    return _points(f"topic/{max(topic(question).split(' '), key=len)}", 1)[0]


def _reword(sentence: str, rng: random.Random) -> str:
    return " ".join(rng.choice(_SYNONYMS[w]) if w in _SYNONYMS else w for w in sentence.split(" "))


class SampledAnswers:
    """Answers of a sampling model: same points for one cluster, new wording on every call."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def answer(self, question: str, cluster: int) -> str:
        rng = random.Random(self._rng.getrandbits(64))
        subject = topic(question)
        points = [topic_point(question), *cluster_points(cluster)]
        rng.shuffle(points)
        sentences = [rng.choice(_OPENINGS).format(t=subject, T=subject.capitalize())]
        for point in points:
            sentences.append(rng.choice(_ADVICE).format(t=subject, a=point.action, o=point.obj))
            if rng.random() < 0.9:
                reason = point.reason
                sentences.append(rng.choice(_WHY).format(r=reason, R=reason[:1].upper() + reason[1:]))
            if rng.random() < 0.8:
                sentences.append(rng.choice(_EXAMPLE).format(e=point.example, E=point.example.capitalize(),
                                                             n=point.number, u=point.unit))
        sentences.append(rng.choice(_HEDGES))
        return _reword(" ".join(s for s in sentences if s), rng)
