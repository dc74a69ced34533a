"""KnowledgeTree: prefix matching, PGDSF eviction within capacity, correction from backend reports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from normalizer.prompt_plan import Segment
from proxy.kv.tree import KnowledgeTree, Match

SYS = Segment("p:sys", 100)


def d(name: str, tokens: int = 500) -> Segment:
    return Segment(name, tokens)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_match_is_the_longest_inserted_prefix_in_tokens() -> None:
    tree = KnowledgeTree(10_000, clock=Clock())
    assert tree.match([SYS, d("a")]) == Match(0, 0)
    assert tree.insert([SYS, d("a"), d("b")]) == Match(0, 0)
    assert tree.match([SYS, d("a"), d("c")]) == Match(2, 600)
    assert tree.match([SYS, d("a"), d("b"), d("c")]) == Match(3, 1100)
    assert tree.match([d("a")]) == Match(0, 0)
    assert tree.insert([SYS, d("a"), d("c")]) == Match(2, 600)
    assert tree.size_tokens == 100 + 500 + 500 + 500


def test_capacity_evicts_the_least_valuable_leaf_never_the_new_path() -> None:
    tree = KnowledgeTree(1500, clock=Clock())
    for _ in range(5):
        tree.insert([SYS, d("hot")])
    tree.insert([SYS, d("hot"), d("cold")])
    tree.insert([SYS, d("other")])
    assert tree.size_tokens <= 1500
    assert tree.match([SYS, d("other")]).tokens == 600  # just inserted: kept
    assert tree.match([SYS, d("hot")]).tokens == 600  # frequent: kept
    assert tree.match([SYS, d("hot"), d("cold")]).segments == 2  # the once-used leaf went
    assert tree.evictions == 1


def test_frequency_protects_and_the_gdsf_clock_ages_old_popularity() -> None:
    tree = KnowledgeTree(1100, clock=Clock())
    for _ in range(3):
        tree.insert([SYS, d("old")])
    tree.insert([SYS, d("x1")])  # evicts x1? no: the new path is pinned, old stays, nothing else to evict
    assert tree.match([SYS, d("old")]).tokens == 600
    for i in range(2, 12):
        tree.insert([SYS, d(f"x{i}")])
    # after enough evictions the clock passes old's priority and it goes too
    assert tree.match([SYS, d("old")]).segments == 1
    assert tree.gdsf_clock > 0


def test_a_shortfall_report_shrinks_a_full_trees_capacity_and_drops_stale_branches() -> None:
    tree = KnowledgeTree(1600, clock=Clock(), tolerance_tokens=8)
    tree.insert([SYS, d("a"), d("b")])
    tree.insert([SYS, d("a"), d("c")])
    predicted = tree.insert([SYS, d("a"), d("b")])
    assert predicted.tokens == 1100 and tree.size_tokens == 1600
    tree.correct([SYS, d("a"), d("b")], cached_tokens_reported=100, predicted=predicted)
    assert tree.capacity_tokens < 1600
    assert tree.match([SYS, d("a"), d("b")]).tokens == 1100  # recomputed by this very request
    assert tree.match([SYS, d("a"), d("c")]).tokens == 600  # c was behind the lost prefix


def test_a_shortfall_in_a_tree_far_below_capacity_drops_branches_but_keeps_the_capacity() -> None:
    tree = KnowledgeTree(10_000, clock=Clock(), tolerance_tokens=8)
    tree.insert([SYS, d("a"), d("b")])
    tree.insert([SYS, d("a"), d("c")])
    predicted = tree.insert([SYS, d("a"), d("b")])
    tree.correct([SYS, d("a"), d("b")], cached_tokens_reported=100, predicted=predicted)
    assert tree.capacity_tokens == 10_000  # the backend overwrote a prompt on its own: not a smaller cache
    assert tree.match([SYS, d("a"), d("c")]).tokens == 600


def test_a_surplus_report_grows_capacity_within_bounds() -> None:
    tree = KnowledgeTree(1000, clock=Clock(), max_capacity_tokens=1100)
    for _ in range(10):
        tree.insert([SYS, d("a")])
        tree.correct([SYS, d("a")], 600, Match(0, 0))
    assert tree.capacity_tokens == 1100


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=5, unique=True), min_size=1, max_size=60),
    st.integers(600, 5000),
)
def test_size_stays_within_capacity_and_matches_the_stored_tokens(
    seqs: list[list[int]], capacity: int
) -> None:
    tree = KnowledgeTree(capacity, clock=Clock())
    for seq in seqs:
        path = [SYS, *(d(f"d{i}", 100 + 37 * i) for i in seq)]
        tree.insert(path)
        assert tree.match(path).segments == len(path)
        pinned = sum(s.tokens for s in path)
        assert tree.size_tokens <= max(capacity, pinned)
    # size is the sum over stored nodes
    total = 0
    stack: list[tuple[list[str], int]] = [([], 0)]
    seen = 0
    while stack:
        keys, _ = stack.pop()
        for key, tokens in tree.children_of(keys):
            total += tokens
            seen += 1
            stack.append(([*keys, key], tokens))
    assert total == tree.size_tokens and seen == tree.node_count


def test_what_a_request_in_flight_computes_is_not_cached_before_it_is_settled() -> None:
    """A llama.cpp slot cannot reuse what another slot is still computing: a second request sharing the first's new
    documents while it runs is predicted without them, and its shortfall is no reason to drop the first's branch."""
    tree = KnowledgeTree(100_000, clock=Clock())
    tree.insert([SYS, d("a")])
    first = [SYS, d("a"), d("b"), d("c")]
    predicted = tree.insert(first, in_flight=True)
    assert predicted == Match(2, 600)
    second = [SYS, d("a"), d("b"), d("e")]
    assert tree.insert(second, in_flight=True) == Match(2, 600), "b is being computed, not cached"
    tree.correct(second, 600, Match(2, 600))
    tree.settled(first, predicted)
    assert tree.match(first) == Match(4, 1600), "the first request's branch stays, cached once it is answered"
    assert tree.match(second) == Match(3, 1100)
    tree.settled(second, Match(2, 600))
    assert tree.match(second) == Match(4, 1600)


def test_a_report_short_by_the_chat_templates_tokens_confirms_a_wholly_reused_path() -> None:
    """A report is converted into the tree's estimated tokens by the whole prompt's ratio, and the estimate counts
    no chat-template tokens: a path reused whole comes back about 20 tokens short (17-20 measured on llama.cpp).
    That must not read as a lost document, which would drop the branches that continue the path."""
    tree = KnowledgeTree(100_000, clock=Clock())
    tree.insert([SYS, d("a"), d("b"), d("c")])
    predicted = tree.insert([SYS, d("a"), d("b")])
    assert predicted.tokens == 1100
    tree.correct([SYS, d("a"), d("b")], cached_tokens_reported=1080, predicted=predicted)
    assert tree.match([SYS, d("a"), d("b"), d("c")]).tokens == 1600
