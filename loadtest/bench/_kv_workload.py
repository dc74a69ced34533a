"""The kv benchmarks' workload: a corpus of documents with Zipf-distributed popularity; each request has one system
prompt, the top-k (3-5) documents in a varying retrieval order, and a fresh question (see :mod:`loadtest.bench.kv`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from normalizer.documents import Document

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "gu", "he", "zo", "fi", "ba", "ly"]


@dataclass(frozen=True, slots=True)
class Workload:
    system: str
    documents: list[Document]
    requests: list[tuple[list[int], str]]
    """Per request: indices of its documents in retrieval order, and its question."""


def make_workload(*, docs: int, requests: int, doc_words: int, seed: int, zipf_s: float = 1.1) -> Workload:
    rnd = random.Random(seed)
    words = ["".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 3))) for _ in range(600)]

    def sentence(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n)).capitalize() + "."

    system = "You answer questions using only the documents below. Cite them. " + " ".join(
        sentence(12) for _ in range(6)
    )
    corpus = [
        Document(
            f"doc-{i}", " ".join(sentence(rnd.randint(8, 16)) for _ in range(doc_words // 12)), f"Doc {i}"
        )
        for i in range(docs)
    ]
    weights = [1 / (r + 1) ** zipf_s for r in range(docs)]
    reqs = []
    for i in range(requests):
        k = min(rnd.randint(3, 5), docs)  # (a corpus under 5 documents would never fill a top-5)
        chosen: list[int] = []
        while len(chosen) < k:
            pick = rnd.choices(range(docs), weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        rnd.shuffle(chosen)
        reqs.append((chosen, f"Question {i}: " + sentence(10)))
    return Workload(system, corpus, reqs)
