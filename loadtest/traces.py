"""Synthetic cache traces for the policy simulator (``ragproxy simulate``, ``python -m loadtest.simulate``).

``size`` is the bytes a cached entry occupies, ``cost`` what a miss on it costs (here: upstream latency in
ms), ``time`` seconds since the trace began. Generators model what this proxy sees; every one is a pure
function of ``(requests, seed)`` so benchmarks are reproducible:

- ``zipf``: Zipf-popular questions (a=0.9), each asked in a few paraphrases (distinct exact keys);
- ``ohw50`` / ``ohw80``: one-hit-wonder heavy streams (BEIR-style): a Zipf-popular core plus a stream of
  unique queries, tuned so that about 50% / 80% of distinct items are seen exactly once;
- ``scan``: Zipf traffic interrupted by sequential scans over a large evaluation set (each key once per scan);
- ``shifting``: Zipf popularity whose ranking is reshuffled every quarter of the trace;
- ``mixed``: four request kinds with sizes over three orders of magnitude and costs only loosely tied to size
  (embeddings, vector searches, small-model answers, large-model answers).

Entry kinds (size, cost) are drawn once per key from lognormal distributions; a key keeps its size and cost
for the whole trace. Records and trace files are the product's (:mod:`tiers.policies.trace`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tiers.policies.trace import TraceRecord, working_set_bytes, write_trace


@dataclass(frozen=True, slots=True)
class EntryKind:
    """A family of entries: lognormal size (bytes) and a cost of ``base_ms + per_kib_ms * KiB`` with noise."""

    name: str
    median_size: int
    size_sigma: float
    base_ms: float
    per_kib_ms: float
    cost_sigma: float = 0.3

    def draw(self, rng: random.Random) -> tuple[int, float]:
        size = max(64, int(rng.lognormvariate(math.log(self.median_size), self.size_sigma)))
        cost = (self.base_ms + self.per_kib_ms * size / 1024) * rng.lognormvariate(0.0, self.cost_sigma)
        return size, round(cost, 2)


# About 4 bytes per token of answer text plus the JSON envelope; a 7B model streams ~100 tokens/s (10 ms per
# token ~ 2.5 ms per byte), a 70B one ~25 tokens/s; embeddings and searches cost roughly a fixed latency.
EMBEDDING = EntryKind("embedding", median_size=3_200, size_sigma=0.1, base_ms=15, per_kib_ms=0)
SEARCH = EntryKind("search", median_size=12_000, size_sigma=0.6, base_ms=40, per_kib_ms=1)
ANSWER_7B = EntryKind("answer-7b", median_size=1_200, size_sigma=0.8, base_ms=80, per_kib_ms=2_500)
ANSWER_70B = EntryKind("answer-70b", median_size=2_000, size_sigma=0.8, base_ms=300, per_kib_ms=10_000)

_ARRIVALS_PER_SECOND = 20.0


class _Catalogue:
    """Draws each key's (size, cost) on first sight from a weighted choice of kinds, then remembers it."""

    def __init__(self, rng: random.Random, kinds: list[tuple[EntryKind, float]]) -> None:
        self._rng = rng
        self._kinds = [kind for kind, _ in kinds]
        self._cumulative = list(itertools.accumulate(weight for _, weight in kinds))
        self._entries: dict[str, tuple[int, float]] = {}

    def entry(self, key: str) -> tuple[int, float]:
        found = self._entries.get(key)
        if found is None:
            kind = self._rng.choices(self._kinds, cum_weights=self._cumulative)[0]
            found = self._entries[key] = kind.draw(self._rng)
        return found


class _Zipf:
    """Ranks 0..n-1 with probability proportional to 1 / (rank + 1) ** exponent."""

    def __init__(self, n: int, exponent: float) -> None:
        self._cumulative = list(itertools.accumulate(1.0 / (rank + 1) ** exponent for rank in range(n)))

    def draw(self, rng: random.Random) -> int:
        return bisect.bisect(self._cumulative, rng.random() * self._cumulative[-1])


def _stamp(rng: random.Random, keys: Iterable[str], catalogue: _Catalogue) -> Iterator[TraceRecord]:
    now = 0.0
    for key in keys:
        now += rng.expovariate(_ARRIVALS_PER_SECOND)
        size, cost = catalogue.entry(key)
        yield TraceRecord(key, size, cost, round(now, 4))


_LLM_KINDS = [(ANSWER_7B, 0.7), (ANSWER_70B, 0.3)]
_RAG_KINDS = [(SEARCH, 0.5), (ANSWER_7B, 0.35), (ANSWER_70B, 0.15)]
_MIXED_KINDS = [(EMBEDDING, 0.3), (SEARCH, 0.3), (ANSWER_7B, 0.25), (ANSWER_70B, 0.15)]


def _paraphrased(rng: random.Random, question: int) -> str:
    """The usual phrasing of a question half the time, otherwise one of a few paraphrases."""
    variant = 0 if rng.random() < 0.5 else rng.randint(1, 4)
    return f"q{question}/p{variant}"


def zipf(requests: int, seed: int) -> Iterator[TraceRecord]:
    rng = random.Random(seed)
    popularity = _Zipf(max(1, requests // 10), 0.9)
    keys = (_paraphrased(rng, popularity.draw(rng)) for _ in range(requests))
    return _stamp(rng, keys, _Catalogue(rng, _LLM_KINDS))


def _one_hit_wonder(requests: int, seed: int, unique_share: float) -> Iterator[TraceRecord]:
    rng = random.Random(seed)
    popularity = _Zipf(max(1, requests // 20), 0.8)
    unique = itertools.count()

    def keys() -> Iterator[str]:
        for _ in range(requests):
            if rng.random() < unique_share:
                yield f"once{next(unique)}"
            else:
                yield f"hot{popularity.draw(rng)}"

    return _stamp(rng, keys(), _Catalogue(rng, _RAG_KINDS))


def ohw50(requests: int, seed: int) -> Iterator[TraceRecord]:
    return _one_hit_wonder(requests, seed, unique_share=0.055)


def ohw80(requests: int, seed: int) -> Iterator[TraceRecord]:
    return _one_hit_wonder(requests, seed, unique_share=0.19)


def scan(requests: int, seed: int) -> Iterator[TraceRecord]:
    rng = random.Random(seed)
    popularity = _Zipf(max(1, requests // 10), 0.9)
    scan_length = max(1, requests // 10)

    def keys() -> Iterator[str]:
        emitted = 0
        while emitted < requests:
            for _ in range(min(requests // 5 or 1, requests - emitted)):
                yield f"q{popularity.draw(rng)}"
                emitted += 1
            for position in range(min(scan_length, requests - emitted)):
                yield f"eval{position}"
                emitted += 1

    return _stamp(rng, keys(), _Catalogue(rng, _RAG_KINDS))


def shifting(requests: int, seed: int) -> Iterator[TraceRecord]:
    rng = random.Random(seed)
    items = max(1, requests // 10)
    popularity = _Zipf(items, 0.9)
    phase_length = max(1, requests // 4)
    ranking = list(range(items))

    def keys() -> Iterator[str]:
        for index in range(requests):
            if index and index % phase_length == 0:
                rng.shuffle(ranking)
            yield f"q{ranking[popularity.draw(rng)]}"

    return _stamp(rng, keys(), _Catalogue(rng, _LLM_KINDS))


def mixed(requests: int, seed: int) -> Iterator[TraceRecord]:
    rng = random.Random(seed)
    popularity = _Zipf(max(1, requests // 5), 0.85)
    keys = (f"k{popularity.draw(rng)}" for _ in range(requests))
    return _stamp(rng, keys, _Catalogue(rng, _MIXED_KINDS))


GENERATORS: dict[str, Callable[[int, int], Iterator[TraceRecord]]] = {
    "zipf": zipf,
    "ohw50": ohw50,
    "ohw80": ohw80,
    "scan": scan,
    "shifting": shifting,
    "mixed": mixed,
}
ONE_HIT_WONDER_TRACES = ("ohw50", "ohw80")


def generate(name: str, requests: int, seed: int = 0) -> list[TraceRecord]:
    """The trace ``name`` (one of ``GENERATORS``) with ``requests`` lookups; ValueError if unknown."""
    generator = GENERATORS.get(name)
    if generator is None:
        raise ValueError(f"unknown trace {name!r}; allowed: {', '.join(GENERATORS)}")
    return list(generator(requests, seed))


def one_hit_fraction(requests: Iterable[TraceRecord]) -> float:
    """Share of distinct keys that are requested exactly once."""
    counts: dict[str, int] = {}
    for request in requests:
        counts[request.key] = counts.get(request.key, 0) + 1
    return sum(1 for count in counts.values() if count == 1) / len(counts) if counts else 0.0


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtest.traces NAME REQUESTS PATH [SEED]``: write a generated trace to a JSONL file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4) or args[0] not in GENERATORS:
        names = ",".join(GENERATORS)
        print(f"usage: python -m loadtest.traces {{{names}}} REQUESTS PATH [SEED]", file=sys.stderr)
        return 2
    trace = generate(args[0], int(args[1]), int(args[3]) if len(args) == 4 else 0)
    write_trace(args[2], trace)
    print(f"{len(trace)} requests, {working_set_bytes(trace)} bytes working set, "
          f"{one_hit_fraction(trace):.0%} of keys seen once -> {args[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
