"""When a newcomer to a replica's cache-aware waiting queue is expected to start its prefill.

Pure: replays :class:`~proxy.kv.admission_queue.CacheAwareOrder` on what waits now plus the newcomer. At each
start the replica's prefill in hand is done; the entries whose deadline has passed are dropped (they never run);
an entry that has waited ``window_s`` or longer goes first (oldest first); otherwise the best ``cached / compute``
ratio goes (ties by arrival). Each start adds that entry's estimated prefill, divided by the replica's
parallelism. Later arrivals with a better ratio than the newcomer's go before it until it has waited
``window_s``: they come as a flow of ``overtaking`` prefill seconds per second (what such requests brought
lately), taken before the newcomer whenever its turn comes. The newcomer is never dropped here: the caller
compares its start with its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """One request in the waiting queue, as the router admitted it."""

    prefill_s: float
    ratio: float
    """``cached / compute`` tokens: the queue's order."""
    enqueued_at: float
    deadline: float | None


def expected_start(
    ahead: Sequence[Waiting],
    ratio: float,
    now: float,
    free_at: float,
    window_s: float,
    parallelism: int = 1,
    overtaking: float = 0.0,
) -> float:
    """Start time of a newcomer with ``ratio`` queued at ``now`` behind ``ahead`` (in arrival order), when the
    replica's prefill in hand ends at ``free_at``."""
    count = len(ahead)
    ratios = [w.ratio for w in ahead] + [ratio]
    enqueued = [w.enqueued_at for w in ahead] + [now]
    deadlines = [w.deadline for w in ahead] + [None]
    by_ratio = sorted(range(count + 1), key=lambda i: (-ratios[i], i))
    gone = [False] * (count + 1)
    width = max(1, parallelism)
    t = free_at
    oldest = best = 0
    overtaken = 0.0
    """Prefill seconds of later arrivals already taken before the newcomer."""

    def dropped(i: int) -> bool:
        deadline = deadlines[i]
        if not gone[i] and deadline is not None and t > deadline:
            gone[i] = True
        return gone[i]

    while True:
        while dropped(oldest):  # the newcomer (last) is never dropped: this stops
            oldest += 1
        pick = oldest
        if t - enqueued[oldest] < window_s:
            while dropped(by_ratio[best]):
                best += 1
            pick = by_ratio[best]
        if pick == count:
            owed = overtaking * (t - now) - overtaken
            if owed <= 1e-6 or t - now >= window_s:
                return t
            overtaken += owed  # they arrived meanwhile and go first
            t += owed / width
            continue
        gone[pick] = True
        t += ahead[pick].prefill_s / width
