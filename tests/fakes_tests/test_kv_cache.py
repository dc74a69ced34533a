"""The KV-cache model: prefix reuse by chained block hashes, LRU eviction, prefill time, slot queueing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upstream_doubles.kv_cache import KVCacheModel, SlotSchedule, block_keys, tokenize


def words(prefix: str, n: int) -> list[int]:
    return tokenize(" ".join(f"{prefix}{i}" for i in range(n)))


def test_tokenize_is_deterministic_and_word_based() -> None:
    assert tokenize("a b  c\nd") == tokenize("a b c d")
    assert len(tokenize("one two three")) == 3
    assert tokenize("x") != tokenize("y")


def test_cached_prefix_grows_with_shared_prefix() -> None:
    kv = KVCacheModel(capacity_blocks=100, block_size=4, per_token_s=0.001, overhead_s=0.0)
    system = words("sys", 8)
    cold = kv.prefill(system + words("a", 5))
    assert (cold.cached, cold.uncached) == (0, 13) and cold.seconds == pytest.approx(0.013)
    assert kv.prefill(system + words("b", 5)).cached == 8  # shared system prompt: two full blocks
    assert kv.prefill(system + words("b", 9)).cached == 12  # and now the first block of "b" too
    assert (
        kv.prefill(system + words("b", 9)).cached == 16
    )  # all four full blocks (17 tokens, the last one computed)
    assert kv.prefill(words("other", 20)).cached == 0


def test_block_keys_are_chained() -> None:
    a = words("x", 8)
    b = [*words("y", 4), *a[4:]]  # same second block, different first block
    assert block_keys(a, 4)[1] != block_keys(b, 4)[1]
    assert block_keys(a, 4)[0] == block_keys(a[:5], 4)[0]


def test_whole_prompt_hit_still_computes_the_last_token() -> None:
    kv = KVCacheModel(block_size=4)
    tokens = words("t", 8)
    kv.prefill(tokens)
    assert kv.prefill(tokens)[:2] == (7, 1)


def test_lru_eviction_drops_least_recent_prompts_tails_first() -> None:
    kv = KVCacheModel(capacity_blocks=4, block_size=4)
    first, second = words("first", 8), words("second", 8)
    kv.prefill(first)
    kv.prefill(second)
    assert kv.used_blocks == 4
    kv.prefill(first)  # touch first: now the most recent
    kv.prefill(words("third", 4))  # one new block evicts the tail of "second"
    assert kv.used_blocks == 4
    assert kv.cached_prefix([*first, 1]) == 8
    assert kv.cached_prefix([*second, 1]) == 4  # its head survives, its tail went first
    kv.prefill(words("fourth", 12))
    assert kv.cached_prefix([*second, 1]) == 0


def test_prefill_time_is_proportional_to_uncached_tokens() -> None:
    kv = KVCacheModel(capacity_blocks=1000, block_size=16, per_token_s=0.0005, overhead_s=0.01)
    documents = words("doc", 1600)
    cold = kv.prefill(documents + words("q1", 10))
    warm = kv.prefill(documents + words("q2", 10))
    assert cold.seconds == pytest.approx(0.01 + 0.0005 * 1610)
    assert warm.uncached == 1610 - 1600 and warm.seconds == pytest.approx(0.01 + 0.0005 * 10)
    assert kv.estimate(documents).seconds == pytest.approx(0.01 + 0.0005 * 1)


def test_cache_prompt_false_neither_reads_nor_writes() -> None:
    kv = KVCacheModel(block_size=4)
    tokens = words("p", 12)
    assert kv.prefill(tokens, use_cache=False) == (0, 12, kv.prefill_seconds(12))
    assert kv.used_blocks == 0
    kv.prefill(tokens)
    assert kv.prefill(tokens, use_cache=False).cached == 0


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=200),
    st.integers(1, 8),
    st.integers(0, 30),
)
def test_invariants(tokens: list[int], block_size: int, capacity: int) -> None:
    kv = KVCacheModel(capacity_blocks=capacity, block_size=block_size)
    first = kv.prefill(tokens)
    again = kv.prefill(tokens)
    assert first.cached + first.uncached == len(tokens) == again.cached + again.uncached
    assert kv.used_blocks <= capacity
    assert again.cached <= max(0, len(tokens) - 1)
    full_blocks = len(tokens) // block_size
    if full_blocks <= capacity:
        assert again.cached == max(0, min(full_blocks * block_size, len(tokens) - 1))
    assert again.seconds <= first.seconds


def test_slot_schedule_queues_when_all_slots_are_busy() -> None:
    schedule = SlotSchedule(slots=2)
    a = schedule.admit(0.0, 1.0)
    b = schedule.admit(0.0, 1.0)
    c = schedule.admit(0.5, 1.0)
    assert {a.slot, b.slot} == {0, 1}
    assert (c.start, c.wait, c.end) == (1.0, 0.5, 2.0)
    pinned = schedule.admit(0.5, 1.0, slot=c.slot)
    assert pinned.start == 2.0 and pinned.wait == 1.5
    assert schedule.next_start(10.0) == 10.0
    with pytest.raises(ValueError):
        schedule.admit(0.0, 1.0, slot=2)
