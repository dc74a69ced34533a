"""expected_start foresees what the cache-aware waiting queue does (replayed with the queue itself)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kv.admission_queue import CacheAwareOrder
from proxy.kv.expected_start import Waiting, expected_start

entries = st.lists(
    st.tuples(
        st.integers(1, 40),  # prefill, in 0.1 s
        st.integers(0, 3),  # cached tokens (ratio = cached / compute)
        st.integers(1, 3),  # compute tokens
        st.integers(0, 5),  # waited so far, 0.1 s steps after the previous
        st.one_of(st.none(), st.integers(0, 60)),  # deadline, 0.1 s
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(entries, st.integers(0, 3), st.integers(1, 3), st.integers(0, 20), st.integers(0, 30))
def test_the_foreseen_start_is_where_the_queue_starts_the_newcomer(
    ahead: list[tuple[int, int, int, int, int | None]], cached: int, compute: int, backlog: int, window: int
) -> None:
    order: CacheAwareOrder[int] = CacheAwareOrder(starvation_window_s=window / 10)
    waiting, at = [], 0.0
    for index, (prefill, c, k, gap, deadline) in enumerate(ahead):
        at += gap / 10
        due = None if deadline is None else deadline / 10
        order.push(index, c, k, at, due)
        waiting.append(Waiting(prefill / 10, c / max(1, k), at, due))
    now = at
    order.push(-1, cached, compute, now)
    t = now + backlog / 10
    while (item := order.pop(t)) != -1:  # no later arrivals; each start adds its prefill
        assert item is not None
        t += ahead[item][0] / 10
    foreseen = expected_start(waiting, cached / max(1, compute), now, now + backlog / 10, window / 10)
    assert abs(foreseen - t) < 1e-9
