"""The kv benchmark's perfect-prefix-cache ceiling (:func:`loadtest.bench._kv_reuse.prefix_reuse_ceiling`)."""

from __future__ import annotations

import math

from loadtest.bench._kv_reuse import Routed, prefix_reuse_ceiling, reuse_losses
from loadtest.bench._kv_workload import Workload, make_workload
from normalizer.documents import Document, render_document
from normalizer.prompt_plan import Segment


def _tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def test_a_repeat_reuses_everything_but_its_question() -> None:
    docs = [Document(f"d{i}", f"text {i} " * 40, f"D{i}") for i in range(3)]
    work = Workload("system " * 20, docs, [([0, 1, 2], "q one?"), ([0, 1, 2], "q two?")])
    system, documents = _tokens(work.system), sum(_tokens(render_document(d)) for d in docs)
    assert prefix_reuse_ceiling(work, 1) == (system + documents) / (system + documents + _tokens("q two?"))


def test_the_top_document_stays_at_an_edge() -> None:
    docs = [Document(f"d{i}", f"text {i} " * 40, f"D{i}") for i in range(3)]
    # the second request ranks d1 first: d1 must lead or close, so of the cached [d0, d1, d2] only d0 can be reused
    work = Workload("system " * 20, docs, [([0, 1, 2], "q"), ([1, 0, 2], "q")])
    system, sizes = _tokens(work.system), [_tokens(render_document(d)) for d in docs]
    assert prefix_reuse_ceiling(work, 1) == (system + sizes[0]) / (system + sum(sizes) + _tokens("q"))


def test_a_corpus_smaller_than_the_top_k_still_makes_requests() -> None:
    work = make_workload(docs=4, requests=20, doc_words=24, seed=1)  # drew 5 of 4 documents forever before
    assert len(work.requests) == 20
    assert all(3 <= len(chosen) <= 4 and len(set(chosen)) == len(chosen) for chosen, _ in work.requests)


def test_reuse_losses_split_the_history_by_replica() -> None:
    s, a, b = Segment("s", 10), Segment("a", 100), Segment("b", 100)
    routed = [
        Routed(0, 0, 0, (s, a, b), 220, 0, 0),
        Routed(1, 1, 1, (s, a, b), 220, 10, 10),  # another replica: one cache would have held s, a, b
        Routed(2, 2, 0, (s, a), 120, 110, 100),
    ]
    ceiling = [(0, 220), (210, 220), (110, 120)]
    losses = reuse_losses(routed, 1, ceiling)
    assert losses == {"ceiling": round(320 / 340, 3), "one_cache": round(320 / 340, 3),
                      "same_replica": round(110 / 340, 3), "predicted": round(120 / 340, 3),
                      "reported": round(110 / 340, 3)}
