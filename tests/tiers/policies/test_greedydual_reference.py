"""The O(log n) GreedyDual (Landlord, GDSF, BP-Cache's main cache) equals the charge-every-entry algorithm."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiers.policies.reference import ReferenceGreedyDual
from tiers.policies.bpcache import BPCachePolicy
from tiers.policies.greedydual import GreedyDualPolicy

KEYS = [f"k{i}" for i in range(10)]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from(KEYS), st.integers(0, 40),
                  st.integers(0, 60).map(Fraction)),
        st.tuples(st.just("hit"), st.sampled_from(KEYS)),
        st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    ),
    max_size=120,
)


def apply(policy: Any, operation: tuple[Any, ...]) -> Any:
    if operation[0] == "insert":
        decision = policy.insert(operation[1], operation[2], operation[3])
        return decision.admitted, sorted(decision.evicted)
    getattr(policy, operation[0])(operation[1])
    return None


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 120), frequency=st.booleans(), bypass=st.booleans(), ops=operations)
def test_lazy_offset_equals_charging_every_entry(
    capacity: int, frequency: bool, bypass: bool, ops: list[tuple[Any, ...]]
) -> None:
    fast = GreedyDualPolicy(capacity, frequency=frequency, bypass=bypass)
    reference = ReferenceGreedyDual(capacity, frequency=frequency, bypass=bypass)
    for operation in ops:
        assert apply(fast, operation) == apply(reference, operation), operation
        assert fast.used == reference.used
        assert sorted(k for k in KEYS if k in fast) == sorted(reference.sizes)
        for key in reference.sizes:
            assert fast.credit(key) == reference.credit(key)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 200), small_ratio=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
       unread_credit=st.sampled_from([None, Fraction(0), Fraction(1, 2), Fraction(1)]), ops=operations)
def test_bpcache_main_cache_equals_reference(
    capacity: int, small_ratio: float, unread_credit: Fraction | None, ops: list[tuple[Any, ...]]
) -> None:
    def fast_main(size: int) -> GreedyDualPolicy:
        return GreedyDualPolicy(size, frequency=True, bypass=True)

    def reference_main(size: int) -> ReferenceGreedyDual:
        return ReferenceGreedyDual(size, frequency=True, bypass=True)

    options: dict[str, Any] = {"small_ratio": small_ratio, "unread_credit": unread_credit}
    fast = BPCachePolicy(capacity, main_policy=fast_main, **options)
    reference = BPCachePolicy(capacity, main_policy=reference_main, **options)  # type: ignore[arg-type]
    for operation in ops:
        assert apply(fast, operation) == apply(reference, operation), operation
        assert fast.used == reference.used <= capacity
        assert [k in fast for k in KEYS] == [k in reference for k in KEYS]
