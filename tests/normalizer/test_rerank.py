"""Reranker requests as keyed pairs, and answers reassembled: the pure part of the rerank cache."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from normalizer.canonical_json import CanonicalizationError
from normalizer.rerank import (
    RerankRequest,
    Scored,
    document_count,
    malformed,
    read_answer,
    read_rerank,
    render,
    token_shares,
    upstream_body,
)
from normalizer.steps import at_once

BODY = {"model": "m", "query": "q", "documents": ["a", "b", "c"]}


def items(body: dict[str, Any], route: str = "rerank") -> list[Any]:
    return list(read_rerank(body, score=route == "score").items())


def test_forms_are_told_apart_by_route_and_body() -> None:
    assert read_rerank(BODY, score=False).form == "rerank"
    assert read_rerank({"query": "q", "texts": ["a"]}, score=False).form == "tei"
    score = read_rerank({"model": "m", "text_1": ["q1", "q2"], "text_2": ["a", "b"]}, score=True)
    assert score.form == "score" and score.pairs == (("q1", "a"), ("q2", "b"))
    assert read_rerank({"model": "m", "text_1": "q", "text_2": "a"}, score=True).pairs == (("q", "a"),)


def test_what_a_pair_s_key_covers() -> None:
    assert items(BODY) == items({**BODY, "documents": [{"text": "a"}, "b", {"text": "c"}]})
    assert items(BODY) == items({**BODY, "top_n": 2, "priority": 5, "user": "u"}), "they cannot change a score"
    assert items(BODY) != items({**BODY, "return_documents": False}), "stored results differ"
    assert items(BODY) != items({**BODY, "model": "n"})
    assert items(BODY)[0] != items({**BODY, "query": "Q"})[0]
    assert items(BODY) != items({**BODY, "documents": [{"text": "a", "title": "t"}, "b", "c"]})
    assert items({"query": "q", "texts": ["a"]}) != items({"query": "q", "texts": ["a"], "raw_scores": True})
    assert items({"query": "q", "texts": ["a"]})[0] != items({"model": "m", "query": "q", "documents": ["a"]})[0]


@pytest.mark.parametrize(("body", "route"), [
    ({"query": 1, "documents": ["a"]}, "rerank"), ({"query": "q", "documents": []}, "rerank"),
    ({"query": "q", "documents": "a"}, "rerank"), ({"query": "q", "documents": [{"title": "x"}]}, "rerank"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "rerank"), ({"text_1": ["q"], "text_2": ["a", "b"]}, "score"),
    ({"text_1": None, "text_2": ["a"]}, "score"), ({"query": "q", "documents": {"content": []}}, "rerank"),
])
def test_bodies_in_no_known_shape_are_refused(body: dict[str, Any], route: str) -> None:
    with pytest.raises(CanonicalizationError):
        read_rerank(body, score=route == "score")


def test_the_upstream_is_asked_for_the_missing_pairs_only_and_all_of_them() -> None:
    request = read_rerank({**BODY, "top_n": 1, "return_documents": True}, score=False)
    assert upstream_body({**BODY, "top_n": 1, "return_documents": True}, request, [2, 0]) == {
        "model": "m", "query": "q", "documents": ["c", "a"], "return_documents": True}
    pairs = {"text_1": ["q1", "q2", "q3"], "text_2": ["a", "b", "c"]}
    assert upstream_body(pairs, read_rerank(pairs, score=True), [1]) == {"text_1": ["q2"], "text_2": ["b"]}


def test_answers_that_are_not_one_result_per_pair_are_refused() -> None:
    request = read_rerank(BODY, score=False)
    good = {"id": "x", "results": [{"index": 1, "relevance_score": 0.5}, {"index": 0, "relevance_score": 0.9}]}
    read = at_once(read_answer(request, good, 2))
    assert read is not None and [s.score for s in read[0]] == [0.9, 0.5] and read[1] == {"id": "x"}
    for bad in ({"results": [{"index": 0, "relevance_score": 1}]}, {"results": [{"index": 0}] * 2},
                {"results": [{"index": 0, "relevance_score": 1}, {"index": 0, "relevance_score": 1}]},
                {"results": [{"index": 5, "relevance_score": 1}, {"index": 0, "relevance_score": 1}]},
                {"results": [{"index": True, "relevance_score": 1}, {"index": 0, "relevance_score": 1}]},
                [{"index": 0, "score": 1}], {"results": "x"}):
        assert at_once(read_answer(request, bad, 2)) is None


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8), st.none() | st.integers(0, 9))
def test_merged_results_are_sorted_stably_and_cut_after_merging(scores: list[float], top_n: int | None) -> None:
    request = RerankRequest("rerank", tuple(("q", str(i)) for i in range(len(scores))), {}, top_n or None)
    answer = at_once(render(request, [Scored({"relevance_score": s}, s) for s in scores], {"id": "x"},
                            forwarded=True, cached_tokens=0))
    assert isinstance(answer, dict)
    expected = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or None]
    assert [r["index"] for r in answer["results"]] == expected
    assert [r["relevance_score"] for r in answer["results"]] == [scores[i] for i in expected]


def test_usage_counts_cached_pairs_and_a_stored_envelope_s_counts_are_not_this_request_s() -> None:
    request = read_rerank(BODY, score=False)
    scored = [Scored({"relevance_score": 0.1}, 0.1)] * 3
    envelope = {"model": "m", "usage": {"prompt_tokens": 10, "total_tokens": 10}}
    forwarded = at_once(render(request, scored, envelope, forwarded=True, cached_tokens=4))
    assert isinstance(forwarded, dict) and forwarded["usage"] == {"prompt_tokens": 14, "total_tokens": 14}
    stored = at_once(render(request, scored, envelope, forwarded=False, cached_tokens=4))
    assert isinstance(stored, dict) and stored["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


@given(st.lists(st.text(max_size=30), min_size=1, max_size=6), st.integers(0, 500))
def test_token_shares_add_up(documents: list[str], total: int) -> None:
    request = read_rerank({"query": "q", "documents": documents}, score=False)
    shares = at_once(token_shares(request, list(range(len(documents))), total))
    assert sum(shares) == total and all(share >= 0 for share in shares)


def test_documents_are_counted_for_the_reservation() -> None:
    assert document_count(BODY) == 3
    assert document_count({"texts": ["a", "b"]}) == 2
    assert document_count({"text_1": "q", "text_2": ["a"]}) == 1
    assert document_count({"query": "q"}) == 1
    assert document_count({"text_1": "q", "text_2": []}) == 0, "an empty request scores nothing (and costs nothing)"


def test_token_shares_take_time_in_proportion_to_the_documents() -> None:
    """Each share used to divide by a sum over every document: 50,000 documents took seconds."""
    request = read_rerank({"query": "q", "documents": [f"document {n}" for n in range(50_000)]}, score=False)
    steps = token_shares(request, range(50_000), 10**6)
    calls = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            shares = done.value
            break
        calls += 1
    assert calls == 50_000 and sum(shares) == 10**6


@pytest.mark.parametrize(("body", "route", "wrong"), [
    ({"query": "q", "documents": [1, 2]}, "rerank", "documents"), ({"query": "q", "documents": "a"}, "rerank",
                                                                  "documents"),
    ({"query": "q", "texts": [None]}, "rerank", "texts"), ({"query": "q", "documents": ["a"], "top_n": "x"}, "rerank",
                                                           "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, "rerank", "top_n"), ({"query": 3, "documents": ["a"]},
                                                                             "rerank", "query"),
    ({"text_1": "q", "text_2": [1]}, "score", "text_2"), ({"text_1": 5, "text_2": "a"}, "score", "text_1"),
])
def test_wrong_types_no_reranker_accepts_are_named(body: dict[str, Any], route: str, wrong: str) -> None:
    problem = malformed(body, score=route == "score")
    assert problem is not None and f"`{wrong}`" in problem


@pytest.mark.parametrize(("body", "route"), [
    (BODY, "rerank"), ({"query": "q", "documents": []}, "rerank"), ({"query": "q", "documents": {"content": []}},
                                                                     "rerank"),
    ({"query": "q", "documents": [{"image": "https://x/y.png"}], "top_n": 0}, "rerank"), ({"query": "q"}, "rerank"),
    ({"text_1": "q", "text_2": "a"}, "score"), ({"text_1": ["q"], "text_2": [{"content": []}]}, "score"),
])
def test_shapes_some_reranker_accepts_are_left_to_the_upstream(body: dict[str, Any], route: str) -> None:
    assert malformed(body, score=route == "score") is None
