"""Order policies: preserve keeps retrieval order; reuse follows the cached path with the top document at an
edge."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from normalizer.prompt_plan import Segment
from proxy.kv.order import OrderPolicy, Popularity, order_documents, shift_reusable_tokens
from proxy.kv.tree import KnowledgeTree

SYS = Segment("p:s", 50)


def segs(*names: str) -> list[Segment]:
    return [Segment(n, 300) for n in names]


def keys(order: list[Segment]) -> list[str]:
    return [s.key for s in order]


def tree_with(*paths: list[Segment]) -> KnowledgeTree:
    tree = KnowledgeTree(100_000, clock=itertools.count().__next__)
    for path in paths:
        tree.insert([SYS, *path])
    return tree


def test_preserve_never_reorders() -> None:
    tree = tree_with(segs("c", "b", "a"))
    assert keys(order_documents(OrderPolicy.PRESERVE, SYS, segs("a", "b", "c"), tree)) == ["a", "b", "c"]


def test_reuse_follows_the_cached_path_and_puts_the_top_document_last() -> None:
    tree = tree_with(segs("c", "b"))
    assert keys(order_documents(OrderPolicy.REUSE, SYS, segs("a", "b", "c", "d"), tree)) == [
        "c",
        "b",
        "d",
        "a",
    ]


def test_reuse_keeps_the_top_document_first_when_the_cached_path_starts_with_it() -> None:
    tree = tree_with(segs("a", "c", "b"))
    assert keys(order_documents(OrderPolicy.REUSE, SYS, segs("a", "b", "c"), tree)) == ["a", "c", "b"]


def test_reuse_cuts_the_path_before_the_top_document_in_its_middle() -> None:
    tree = tree_with(segs("c", "a", "b"))
    assert keys(order_documents(OrderPolicy.REUSE, SYS, segs("a", "b", "c"), tree)) == ["c", "b", "a"]


def test_reuse_without_anything_cached_is_retrieval_order() -> None:
    tree = tree_with(segs("x", "y"))
    assert keys(order_documents(OrderPolicy.REUSE, SYS, segs("a", "b", "c"), tree)) == ["a", "b", "c"]


@given(
    st.lists(st.permutations(["a", "b", "c", "d", "e"]), min_size=0, max_size=6),
    st.permutations(["a", "b", "c", "d", "e"]),
    st.integers(1, 5),
)
def test_reuse_is_a_permutation_with_top_at_an_edge_and_never_caches_less(
    cached_paths: list[list[str]], ranked_all: list[str], k: int
) -> None:
    tree = tree_with(*(segs(*p[:3]) for p in cached_paths))
    ranked = segs(*ranked_all[:k])
    reuse = order_documents(OrderPolicy.REUSE, SYS, ranked, tree)
    assert sorted(keys(reuse)) == sorted(keys(ranked))
    assert ranked[0] in (reuse[0], reuse[-1])
    assert tree.match([SYS, *reuse]).tokens >= tree.match([SYS, *ranked]).tokens


def test_popularity_decays_and_stays_bounded() -> None:
    popularity = Popularity(half_life_requests=10, capacity=4)
    for _ in range(20):
        popularity.observe(["old"])
    for _ in range(40):
        popularity.observe(["new"])
    assert popularity.score("new") > popularity.score("old") > 0
    for i in range(10):
        popularity.observe([f"x{i}"])
    assert len(popularity._scores) <= 4


def test_reuse_puts_uncached_documents_in_popularity_order_with_top_at_an_edge() -> None:
    tree = tree_with(segs("z"))
    popularity = Popularity()
    for _ in range(3):
        popularity.observe(["c", "b"])
    popularity.observe(["c"])
    order = order_documents(OrderPolicy.REUSE, SYS, segs("a", "b", "c"), tree, popularity=popularity)
    assert keys(order) == ["c", "b", "a"]  # nothing cached: canonical order, top (a) is not the most popular
    order = order_documents(OrderPolicy.REUSE, SYS, segs("c", "a", "b"), tree, popularity=popularity)
    assert keys(order) == ["c", "b", "a"]  # top (c) is the most popular: first


def test_shift_puts_the_documents_the_latest_prompt_holds_before_those_it_lacks() -> None:
    # cached: S a x c b (older) and S a y d (latest through a); request: top e, then d, b, c
    tree = tree_with(segs("a", "x", "c", "b"), segs("a", "y", "d"))
    ranked = segs("e", "a", "c", "b", "d")
    reuse = order_documents(OrderPolicy.REUSE, SYS, ranked, tree)
    shift = order_documents(OrderPolicy.SHIFT, SYS, ranked, tree)
    assert keys(reuse)[0] == keys(shift)[0] == "a" and keys(shift)[-1] == "e"  # same cached path, top at the end
    assert keys(shift) == ["a", "d", "c", "b", "e"]  # d (in the latest prompt through a) first, then the others
    assert sorted(keys(shift)) == sorted(keys(reuse))


def test_shift_keeps_a_leading_top_document_first_and_regroups_behind_it() -> None:
    tree = tree_with(segs("q", "x", "c", "b"))  # below q the cached prompt holds x, then c, then b
    ranked = segs("q", "b", "c")
    assert keys(order_documents(OrderPolicy.REUSE, SYS, ranked, tree)) == ["q", "b", "c"]
    assert keys(order_documents(OrderPolicy.SHIFT, SYS, ranked, tree)) == ["q", "c", "b"]


def test_shift_reusable_tokens_follow_the_latest_prompt_up_to_the_first_document_it_lacks() -> None:
    tree = tree_with(segs("a", "x", "c", "b"), segs("a", "y", "d", "c"))  # latest through a: y d c
    assert shift_reusable_tokens(tree, [SYS, *segs("a", "d", "c", "b")]) == 50 + 3 * 300  # b is not after c
    assert shift_reusable_tokens(tree, [SYS, *segs("a", "c", "d")]) == 50 + 2 * 300  # d comes before c there
    assert shift_reusable_tokens(tree, [SYS, *segs("a", "e", "d")]) == 50 + 300  # the scan stops at e
    assert shift_reusable_tokens(tree, [SYS, *segs("a", "y")]) == tree.match([SYS, *segs("a", "y")]).tokens
