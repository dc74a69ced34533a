"""Each policy picks its victims by its own rule, and the bypass rules of Landlord and BP-Cache hold."""

from __future__ import annotations

import pytest

from tiers.policies import (
    BPCachePolicy,
    FIFOPolicy,
    GDSFPolicy,
    LandlordPolicy,
    LRUPolicy,
    S3FIFOPolicy,
)


def fill(policy: object, *entries: tuple[str, int, float]) -> None:
    for key, size, cost in entries:
        assert policy.insert(key, size, cost).admitted  # type: ignore[attr-defined]


def test_lru_evicts_least_recently_read() -> None:
    policy = LRUPolicy(30)
    fill(policy, ("a", 10, 1), ("b", 10, 1), ("c", 10, 1))
    policy.hit("a")
    assert policy.insert("d", 10, 1).evicted == ("b",)


def test_fifo_ignores_reads() -> None:
    policy = FIFOPolicy(30)
    fill(policy, ("a", 10, 1), ("b", 10, 1), ("c", 10, 1))
    policy.hit("a")
    assert policy.insert("d", 15, 1).evicted == ("a", "b")


def test_s3fifo_filters_unread_newcomers_and_readmits_ghosts_to_main() -> None:
    policy = S3FIFOPolicy(100, small_ratio=0.1)
    fill(policy, *[(key, 10, 1.0) for key in "abcdefghij"])
    policy.hit("b")
    assert policy.insert("k", 10, 1).evicted == ("a",)  # unread: evicted, remembered as a ghost
    assert policy.insert("l", 10, 1).evicted == ("c",)  # b was read: moved to main, c goes instead
    assert "b" in policy
    assert policy.insert("a", 10, 1).evicted == ("d",)  # the ghost comes back straight into main
    # main now holds b and a; the small queue (e..l) keeps paying for newcomers, main entries stay
    for key in "mnopqrst":
        policy.insert(key, 10, 1)
    assert "a" in policy and "b" in policy


def test_gdsf_evicts_lowest_frequency_cost_per_byte_and_admits_everything() -> None:
    policy = GDSFPolicy(30)
    fill(policy, ("a", 10, 10), ("b", 10, 30), ("c", 10, 20))
    policy.hit("a")
    policy.hit("a")  # 3 reads * 10 = 30 > 20: c is now the cheapest
    decision = policy.insert("d", 10, 1)
    assert decision.admitted and decision.evicted == ("c",)


def test_landlord_bypasses_a_newcomer_that_would_run_out_first_and_charges_rent() -> None:
    policy = LandlordPolicy(30)
    fill(policy, ("a", 10, 10), ("b", 10, 30), ("c", 10, 20))
    decision = policy.insert("d", 10, 1)
    assert not decision.admitted and decision.evicted == ()
    assert policy.credit("a") == pytest.approx(9.0)  # everyone paid 0.1 per byte of rent
    decision = policy.insert("e", 10, 15)
    assert decision.admitted and decision.evicted == ("a",)
    assert policy.credit("b") == pytest.approx(20.0)
    assert policy.credit("e") == pytest.approx(6.0)
    policy.hit("e")  # a read restores the credit to the cost
    assert policy.credit("e") == pytest.approx(15.0)


def test_landlord_prefers_small_expensive_entries_over_large_cheap_ones() -> None:
    policy = LandlordPolicy(100)
    fill(policy, ("large-cheap", 60, 6), ("small-dear", 20, 20))
    assert policy.insert("new", 30, 30).evicted == ("large-cheap",)


def test_bpcache_strict_filter_sends_unread_to_ghost_and_back_into_main() -> None:
    policy = BPCachePolicy(200, small_ratio=0.1, unread_credit=None)  # small 20 bytes, main 180
    fill(policy, ("a", 10, 1), ("b", 10, 1))
    assert policy.in_small("a")
    assert policy.insert("c", 10, 1).evicted == ("a",)
    assert policy.in_ghost("a")
    decision = policy.insert("a", 10, 1)
    assert decision.admitted and "a" in policy and not policy.in_small("a") and not policy.in_ghost("a")


def test_bpcache_promotes_entries_read_in_small() -> None:
    policy = BPCachePolicy(200, small_ratio=0.1, unread_credit=None)
    fill(policy, ("a", 10, 1), ("b", 10, 1))
    policy.hit("a")
    assert policy.insert("c", 10, 1).evicted == ()
    assert "a" in policy and not policy.in_small("a")


def test_bpcache_offers_unread_entries_to_main_at_a_discount() -> None:
    policy = BPCachePolicy(200, small_ratio=0.1, unread_credit=0.5)
    fill(policy, ("a", 10, 8), ("b", 10, 1), ("c", 10, 1))
    assert "a" in policy and not policy.in_small("a")
    assert policy.main.credit("a") == pytest.approx(4.0)  # type: ignore[attr-defined]


def test_bpcache_bypasses_a_ghost_that_is_worth_less_than_main_residents() -> None:
    policy = BPCachePolicy(100, small_ratio=0.2, unread_credit=None)  # small 20, main 80
    policy.main.insert("dear", 80, 1000)
    fill(policy, ("cheap", 10, 1), ("x", 10, 1))
    assert policy.insert("y", 10, 1).evicted == ("cheap",)
    decision = policy.insert("cheap", 10, 1)  # found in the ghost list, offered to main, not worth it
    assert not decision.admitted and decision.evicted == ()
    assert "dear" in policy and "cheap" not in policy


def test_bpcache_is_plain_main_cache_with_no_small_queue() -> None:
    policy = BPCachePolicy(30, small_ratio=0.0)
    fill(policy, ("a", 10, 10), ("b", 10, 30), ("c", 10, 20))
    assert policy.insert("d", 10, 30).evicted == ("a",)
