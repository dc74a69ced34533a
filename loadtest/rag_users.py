"""What the Locust RAG users do, apart from Locust itself: topics, phrasings, prompts, and the cache tally.

A RAG user picks a topic with a Zipf-distributed popularity (a few questions are asked very often, most rarely),
phrases it either the usual way or as a paraphrase (``loadtest.workload``'s prefix variants and rule-based
rewordings of NQ-open questions), embeds the question, searches Qdrant for passages, asks the LLM with the
passages as context, and sometimes follows up in the same conversation. Everything random comes from a seeded
``random.Random``, so two runs with the same seed send the same sequence per user.

The tally counts, per request kind, what the proxy answered in ``X-Cache-Status`` / ``X-Cache-Tier`` (a hit
without ``X-Cache-Tier`` is counted under the tier ``unknown``) and the credits in ``X-Credits-Charged``
(present on complete replies when credits are on). Kept free of Locust so that it type-checks strictly and the
runner can summarise reports without importing gevent.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.workload import DATA, prefix_variants, rephrasings

HIT_STATUSES = frozenset({"HIT", "SEMANTIC_HIT", "STALE"})  # answered from a cache tier
FOLLOW_UPS = (
    "Can you say that in one sentence?",
    "Which of the passages supports that?",
    "Is there anything the passages disagree on?",
)
SYSTEM_PROMPT = "Answer the question using only the numbered passages. Cite passage numbers."


@dataclass(frozen=True, slots=True)
class Topic:
    """One NQ-open question and its short answers."""

    question: str
    answers: tuple[str, ...]


def load_topics(limit: int) -> list[Topic]:
    """The first ``limit`` distinct NQ-open questions (file order), most popular first under Zipf sampling."""
    topics: dict[str, Topic] = {}
    with DATA.open(encoding="utf-8") as lines:
        for line in lines:
            if len(topics) >= limit:
                break
            if line.strip():
                record = json.loads(line)
                question = " ".join(record["question"].split())
                topics.setdefault(question, Topic(question, tuple(record.get("answer") or ())))
    return list(topics.values())


def passages_for(topic: Topic, count: int) -> list[str]:
    """``count`` short passages about a topic (synthetic text around the real answers)."""
    answer = topic.answers[0] if topic.answers else "unknown"
    others = ", ".join(topic.answers[1:]) or answer
    templates = (
        "Reference notes on '{q}': the generally accepted answer is {a}.",
        "Background for '{q}'. Sources also mention {o}; see the linked records.",
        "Q: {q}? A: {a}. This passage was written for retrieval tests.",
        "An encyclopedia paragraph related to '{q}', naming {o} among other facts.",
    )
    return [templates[i % len(templates)].format(q=topic.question, a=answer, o=others) + f" (part {i + 1})"
            for i in range(count)]


class ZipfSampler:
    """Ranks ``0..n-1`` with probability proportional to ``1 / (rank + 1) ** exponent``."""

    def __init__(self, n: int, exponent: float, rng: random.Random) -> None:
        if n < 1:
            raise ValueError("n must be at least 1")
        weights = [1.0 / (rank + 1) ** exponent for rank in range(n)]
        self._cumulative = list(itertools.accumulate(weights))
        self._rng = rng

    def sample(self) -> int:
        point = self._rng.random() * self._cumulative[-1]
        return min(bisect.bisect_left(self._cumulative, point), len(self._cumulative) - 1)


def paraphrase_vector(canonical: Sequence[float], paraphrase: str, spread: float = 0.1) -> list[float]:
    """The search vector of a paraphrase: its question's vector moved by a small, deterministic offset.

    Stands in for a sentence embedder. The fake LLM's embeddings are hashes of the text, so a paraphrase would
    land anywhere; a real embedder puts it close to the question it rephrases. The offset (norm ``spread``
    before normalising, about ``spread ** 2 / 2`` in cosine distance) depends only on the paraphrase's text, so
    a repeated paraphrase searches with exactly the same vector and different paraphrases with nearby ones.
    """
    rng = random.Random(paraphrase)
    offset = [rng.gauss(0.0, 1.0) for _ in canonical]
    offset_norm = math.sqrt(sum(x * x for x in offset)) or 1.0
    moved = [c + spread * o / offset_norm for c, o in zip(canonical, offset, strict=True)]
    norm = math.sqrt(sum(x * x for x in moved)) or 1.0
    return [x / norm for x in moved]


def phrase(question: str, rng: random.Random, paraphrase_share: float) -> str:
    """The question as most users type it, or (with probability ``paraphrase_share``) a paraphrase of it."""
    if rng.random() >= paraphrase_share:
        return question
    return rng.choice([*prefix_variants(question), *rephrasings(question, rng)])


@dataclass(frozen=True, slots=True)
class Credential:
    tenant: str
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def credentials(tenants: int, keys_per_tenant: int) -> list[Credential]:
    """Synthetic API keys, ``keys_per_tenant`` for each of ``tenants`` tenants."""
    return [Credential(f"tenant-{t}", f"rp-load-tenant{t}-key{k}")
            for t in range(1, tenants + 1) for k in range(1, keys_per_tenant + 1)]


def rag_messages(question: str, passages: Sequence[str]) -> list[dict[str, str]]:
    """The chat request of a RAG turn: instructions, numbered passages, the question."""
    numbered = "\n".join(f"[{i + 1}] {text}" for i, text in enumerate(passages))
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Passages:\n{numbered}\n\nQuestion: {question}"}]


@dataclass
class KindTally:
    """Answers of one request kind, by cache outcome."""

    responses: int = 0
    reported: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    tier_hits: dict[str, int] = field(default_factory=dict)
    credits_charged: float = 0.0
    credits_reported: int = 0


class CacheTally:
    """Cache outcomes and credits per request kind, mergeable across Locust workers."""

    def __init__(self) -> None:
        self.kinds: dict[str, KindTally] = {}

    def record(self, kind: str, headers: Mapping[str, str]) -> None:
        tally = self.kinds.setdefault(kind, KindTally())
        tally.responses += 1
        status = headers.get("X-Cache-Status")
        if status:
            tally.reported += 1
            tally.statuses[status] = tally.statuses.get(status, 0) + 1
            if status in HIT_STATUSES:
                tier = headers.get("X-Cache-Tier") or "unknown"
                tally.tier_hits[tier] = tally.tier_hits.get(tier, 0) + 1
        charged = headers.get("X-Credits-Charged")
        if charged:
            try:
                tally.credits_charged += float(charged)
                tally.credits_reported += 1
            except ValueError:
                pass

    def to_dict(self) -> dict[str, Any]:
        return {kind: {"responses": t.responses, "reported": t.reported, "statuses": dict(t.statuses),
                       "tier_hits": dict(t.tier_hits), "credits_charged": t.credits_charged,
                       "credits_reported": t.credits_reported} for kind, t in self.kinds.items()}

    def merge(self, data: Mapping[str, Any]) -> None:
        for kind, values in data.items():
            tally = self.kinds.setdefault(kind, KindTally())
            tally.responses += int(values["responses"])
            tally.reported += int(values["reported"])
            tally.credits_charged += float(values["credits_charged"])
            tally.credits_reported += int(values["credits_reported"])
            for name, target in (("statuses", tally.statuses), ("tier_hits", tally.tier_hits)):
                for key, count in values[name].items():
                    target[key] = target.get(key, 0) + int(count)


def hit_ratios(tally: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per kind and ``all``: hits at each tier / responses that reported a cache status (kinds without any omitted)."""
    ratios: dict[str, dict[str, float]] = {}
    reported_all = 0
    hits_all: dict[str, int] = {}
    for kind, values in sorted(tally.items()):
        reported = int(values["reported"])
        if not reported:
            continue
        reported_all += reported
        ratios[kind] = {tier: count / reported for tier, count in sorted(values["tier_hits"].items())}
        ratios[kind]["any"] = sum(values["tier_hits"].values()) / reported
        for tier, count in values["tier_hits"].items():
            hits_all[tier] = hits_all.get(tier, 0) + int(count)
    if reported_all:
        ratios["all"] = {tier: count / reported_all for tier, count in sorted(hits_all.items())}
        ratios["all"]["any"] = sum(hits_all.values()) / reported_all
    return ratios
