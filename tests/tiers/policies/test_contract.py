"""The contract every eviction policy keeps, run against each name in ``POLICY_NAMES``.

A shadow model follows the decisions (admitted key in, evicted keys out, removed keys out) and must agree with
the policy's own ``__contains__``, ``len`` and ``used`` after every operation.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.policies import DEFAULT_POLICY, POLICY_NAMES, EvictionPolicy, make_policy

KEYS = [f"k{i}" for i in range(12)]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from(KEYS), st.integers(0, 50), st.floats(0, 100)),
        st.tuples(st.just("hit"), st.sampled_from([*KEYS, "never-inserted"])),
        st.tuples(st.just("remove"), st.sampled_from([*KEYS, "never-inserted"])),
    ),
    max_size=150,
)


def replay(policy: EvictionPolicy, ops: list[tuple[Any, ...]]) -> list[Any]:
    """Apply ``ops`` while checking the contract; return the decisions (for determinism checks)."""
    shadow: dict[str, int] = {}
    decisions: list[Any] = []
    for operation in ops:
        if operation[0] == "insert":
            _, key, size, cost = operation
            shadow.pop(key, None)
            decision = policy.insert(key, size, cost)
            decisions.append(decision)
            assert key not in decision.evicted
            assert len(set(decision.evicted)) == len(decision.evicted)
            for victim in decision.evicted:
                assert victim in shadow, f"{victim} evicted but was not resident"
                del shadow[victim]
            if decision.admitted:
                shadow[key] = size
            assert size <= policy.capacity or not decision.admitted
        elif operation[0] == "hit":
            policy.hit(operation[1])
        else:
            policy.remove(operation[1])
            shadow.pop(operation[1], None)
        assert policy.used <= policy.capacity
        assert policy.used == sum(shadow.values())
        assert len(policy) == len(shadow)
        assert {k for k in KEYS if k in policy} == set(shadow)
        assert "never-inserted" not in policy
    return decisions


@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(0, 200), ops=operations)
def test_contract_holds_on_random_operations(name: str, capacity: int, ops: list[tuple[Any, ...]]) -> None:
    replay(make_policy(name, capacity), ops)


@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(0, 200), ops=operations)
def test_same_operations_give_same_decisions(name: str, capacity: int, ops: list[tuple[Any, ...]]) -> None:
    assert replay(make_policy(name, capacity), ops) == replay(make_policy(name, capacity), ops)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_entry_larger_than_capacity_is_bypassed_without_evicting(name: str) -> None:
    policy = make_policy(name, 100)
    assert policy.insert("a", 40, 1.0).admitted
    decision = policy.insert("huge", 101, 1e9)
    assert not decision.admitted and decision.evicted == ()
    assert "huge" not in policy and "a" in policy and policy.used == 40


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_unknown_keys_are_ignored(name: str) -> None:
    policy = make_policy(name, 100)
    policy.insert("a", 10, 1.0)
    policy.hit("missing")
    policy.remove("missing")
    assert len(policy) == 1 and policy.used == 10


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_reinsert_of_resident_key_updates_its_size(name: str) -> None:
    policy = make_policy(name, 1000)
    policy.insert("a", 10, 5.0)
    policy.insert("b", 20, 5.0)
    assert policy.insert("a", 70, 5.0).admitted
    assert policy.used == 90 and len(policy) == 2
    policy.remove("a")
    assert policy.used == 20


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_negative_size_or_cost_is_rejected(name: str) -> None:
    policy = make_policy(name, 100)
    with pytest.raises(ValueError):
        policy.insert("a", -1, 1.0)
    with pytest.raises(ValueError):
        policy.insert("a", 1, -1.0)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_factory_builds_the_named_policy(name: str) -> None:
    policy = make_policy(name, 123)
    assert policy.name == name and policy.capacity == 123 and policy.used == 0 and len(policy) == 0


def test_factory_rejects_unknown_names_and_options() -> None:
    assert DEFAULT_POLICY in POLICY_NAMES
    with pytest.raises(ValueError, match="allowed: lru"):
        make_policy("mru", 10)
    with pytest.raises(ValueError, match="invalid options"):
        make_policy("lru", 10, small_ratio=0.2)
    assert make_policy("bpcache", 1000, small_ratio=0.25).capacity == 1000
