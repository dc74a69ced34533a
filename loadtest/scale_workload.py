"""The workload of the scale-out benchmark (``python -m loadtest.bench scale``): who asks what, what an answer
weighs, and how much memory each setup gets.

Why these parameters (chosen before measuring, from what the comparison is about):

- **What is compared.** A shared pool can only win on two things: it keeps one copy of an answer instead of one
  per replica (round-robin makes every isolated replica pay its own first miss), and it pools memory (three
  budgets hold three times as many distinct answers). The fair comparison therefore gives both setups the
  **same total memory** ``M``: three isolated replicas with ``M/3`` each, versus three replicas whose near caches
  (``near_share`` of their ``M/3``) and one Redis (the rest, ``M·(1 - near_share)``) add up to ``M``.
- **Questions.** The 3,610 real questions of NQ-open (``../shared/data``, beside the checkout), one cache entry each;
  popularity rank is a seeded shuffle of the file (the file's order carries no popularity).
- **Popularity: Zipf, exponent 0.7.** Request popularity seen by caches is Zipf-like with an exponent below 1:
  0.64-0.83 across web-proxy traces (Breslau et al., "Web caching and Zipf-like distributions", INFOCOM 1999);
  search-engine query frequencies are Zipf-distributed too (Xie and O'Hallaron, INFOCOM 2002). 0.7 is inside
  that range, not at its head-heavy end.
- **Requests: as many as questions (3,610).** Query logs have a long tail of one-off questions: in a billion
  AltaVista queries about two thirds of the distinct queries occurred only once (Silverstein et al., SIGIR Forum
  1999). With Zipf 0.7 over 3,610 questions, a trace of 3,610 requests has 59 % of its distinct questions asked
  once (twice as many requests: 45 %; three times: 33 %), so this is the length that matches that tail.
- **Memory: total = half the working set.** The working set is the bytes of the distinct answers the trace
  asks for. A long-tail workload is the one where caching everything is not affordable; half of it is the
  middle ground (the pool can keep the head and the body, not the tail). Each isolated replica thus holds a
  sixth of the working set.
- **Near caches: 1/8 of each replica's budget.** In shared mode a near copy duplicates a Redis entry, so near
  memory buys latency, not hits; an eighth keeps the hottest answers a round trip closer while leaving most of
  the memory to the pool.
- **Answers:** ``chat.completion`` bodies from :class:`loadtest.responses.ResponseGenerator` (NQ-open sentences,
  30/50/20 % short/medium/long, about 1 KiB on average), stored with the tags the proxy writes (``all``, tenant,
  namespace, route, model) under keys shaped like the proxy's.

The head-heavy case (the earlier default: 6,000 requests, Zipf 0.8 over 4,000 questions, 64 MiB per replica,
memory no constraint) is kept as a second reported row; questions beyond NQ-open's 3,610 are numbered variants.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from loadtest.responses import DEFAULT_QUESTIONS, QA, ResponseGenerator, load_questions
from tiers.entry import CachedResponse

DEFAULT_ZIPF = 0.7
DEFAULT_MEMORY_SHARE = 0.5
DEFAULT_NEAR_SHARE = 0.125
TENANT = "anonymous"


@dataclass(frozen=True)
class Shape:
    """One workload's parameters. ``requests``/``distinct`` ``None``: the NQ-open file's size;
    ``l1_mb`` ``None``: ``memory_share`` of the working set, split over the replicas."""

    zipf: float = DEFAULT_ZIPF
    distinct: int | None = None
    requests: int | None = None
    l1_mb: float | None = None
    memory_share: float = DEFAULT_MEMORY_SHARE
    near_share: float = DEFAULT_NEAR_SHARE
    seed: int = 7


HEAD_HEAVY = Shape(zipf=0.8, distinct=4000, requests=6000, l1_mb=64.0)


@dataclass(frozen=True)
class Entry:
    key: str
    response: CachedResponse
    tags: tuple[str, ...]

    @cached_property
    def size(self) -> int:
        return len(self.response.encode())


@dataclass
class Workload:
    """A trace of question indices (popularity rank order) over a catalogue of real questions."""

    shape: Shape
    questions: list[str]
    trace: list[int]
    replicas: int
    pairs: list[QA] = field(repr=False)
    _entries: dict[int, Entry] = field(default_factory=dict, repr=False)

    def entry(self, index: int) -> Entry:
        """The cached answer of question ``index`` (deterministic)."""
        if index not in self._entries:
            question = self.questions[index]
            completion = ResponseGenerator(self.pairs, seed=index).completion()
            body = json.dumps(completion, separators=(",", ":"), ensure_ascii=False).encode()
            digest = hashlib.blake2b(question.encode(), digest_size=32).hexdigest()
            model = str(completion["model"])
            response = CachedResponse(body=body, kind="chat", model=model, meta={"question": question})
            tags = ("all", f"tenant:{TENANT}", f"ns:{TENANT}/default", "route:chat", f"model:{model}")
            self._entries[index] = Entry(f"v1:t:{TENANT}:default:0:chat:{digest}", response, tags)
        return self._entries[index]

    @cached_property
    def distinct_seen(self) -> list[int]:
        return sorted(set(self.trace))

    @cached_property
    def working_set_bytes(self) -> int:
        """Bytes of the distinct answers the trace asks for."""
        return sum(self.entry(index).size for index in self.distinct_seen)

    @cached_property
    def asked_once_share(self) -> float:
        counts = np.bincount(np.asarray(self.trace), minlength=len(self.questions))
        return float((counts == 1).sum() / max(1, (counts > 0).sum()))

    @property
    def replica_bytes(self) -> int:
        """Memory budget of one replica (isolated: its L1; shared: its near cache plus its share of Redis)."""
        if self.shape.l1_mb is not None:
            return int(self.shape.l1_mb * 1024 * 1024)
        return int(self.working_set_bytes * self.shape.memory_share / self.replicas)

    @property
    def near_bytes(self) -> int:
        return int(self.replica_bytes * self.shape.near_share)

    @property
    def redis_bytes(self) -> int:
        """Value bytes the shared Redis may hold: the rest of the replicas' budgets."""
        return self.replicas * self.replica_bytes - self.replicas * self.near_bytes


def catalogue(distinct: int | None, seed: int, pairs: list[QA]) -> list[str]:
    """``distinct`` real questions (all of them by default) in popularity-rank order; numbered variants beyond."""
    questions = [pair.question for pair in pairs]
    random.Random(seed).shuffle(questions)
    count = distinct or len(questions)
    return [questions[n % len(questions)] + ("" if n < len(questions) else f" (#{n // len(questions)})")
            for n in range(count)]


def zipf_trace(requests: int, distinct: int, zipf: float, seed: int) -> list[int]:
    """Question indices drawn independently from a bounded Zipf law (index 0 the most popular)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, distinct + 1) ** zipf
    return [int(x) for x in rng.choice(distinct, size=requests, p=weights / weights.sum())]


def build(shape: Shape, replicas: int) -> Workload:
    pairs = load_questions(DEFAULT_QUESTIONS)
    questions = catalogue(shape.distinct, shape.seed, pairs)
    requests = shape.requests or len(questions)
    return Workload(shape, questions, zipf_trace(requests, len(questions), shape.zipf, shape.seed), replicas, pairs)
