"""S3-FIFO (Yang et al., SOSP 2023): a small FIFO, a main FIFO with second chances, and a ghost list.

Newcomers enter the small queue (``small_ratio`` of the capacity), unless the ghost list remembers them, in
which case they enter main. When room is needed and the small queue holds at least its share (or main is
empty), the oldest small entry is moved to main if it was read while in small (at least ``promote_hits``
times) and otherwise evicted and remembered in the ghost list. Otherwise the oldest main entry is evicted if
its read counter (capped at 3) is zero, or re-queued with the counter decremented. Sizes are in bytes; the
ghost list remembers as many bytes as main holds. Cost is ignored: this is the strongest cost-blind baseline.
"""

from __future__ import annotations

from collections import OrderedDict

from tiers.policies.base import Decision
from tiers.policies.ghost import GhostList
from tiers.policies.greedydual import check_entry

_ADMITTED = Decision(admitted=True)
_BYPASSED = Decision(admitted=False)
_MAX_FREQUENCY = 3


class S3FIFOPolicy:
    """Small FIFO filters one-hit wonders; main FIFO with second chances keeps the rest."""

    name = "s3fifo"

    def __init__(self, capacity: int, small_ratio: float = 0.1, promote_hits: int = 1) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
        if not 0.0 <= small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in [0, 1), got {small_ratio}")
        self.capacity = capacity
        self.small_target = int(capacity * small_ratio)
        self.promote_hits = promote_hits
        self._small: OrderedDict[str, int] = OrderedDict()
        self._main: OrderedDict[str, int] = OrderedDict()
        self._hits: dict[str, int] = {}
        self._ghost = GhostList(capacity - self.small_target)
        self._small_used = 0
        self._main_used = 0

    @property
    def used(self) -> int:
        return self._small_used + self._main_used

    def __len__(self) -> int:
        return len(self._hits)

    def __contains__(self, key: object) -> bool:
        return key in self._hits

    def insert(self, key: str, size: int, cost: float) -> Decision:
        check_entry(size, cost)
        self.remove(key)
        if size > self.capacity:
            return _BYPASSED
        evicted: list[str] = []
        while self._small_used + self._main_used + size > self.capacity:
            self._evict_one(evicted)
        self._hits[key] = 0
        if self._ghost.take(key):
            self._main[key] = size
            self._main_used += size
        else:
            self._small[key] = size
            self._small_used += size
        return Decision(admitted=True, evicted=tuple(evicted)) if evicted else _ADMITTED

    def hit(self, key: str) -> None:
        hits = self._hits.get(key)
        if hits is not None and hits < _MAX_FREQUENCY:
            self._hits[key] = hits + 1

    def remove(self, key: str) -> None:
        if self._hits.pop(key, None) is None:
            return
        size = self._small.pop(key, None)
        if size is not None:
            self._small_used -= size
        else:
            self._main_used -= self._main.pop(key)

    def _evict_one(self, evicted: list[str]) -> None:
        """One step towards room: promote or evict the oldest small entry, or requeue or evict main's."""
        if self._small and (self._small_used >= self.small_target or not self._main):
            key, size = self._small.popitem(last=False)
            self._small_used -= size
            if self._hits[key] >= self.promote_hits:
                self._hits[key] = 0
                self._main[key] = size
                self._main_used += size
            else:
                del self._hits[key]
                self._ghost.add(key, size)
                evicted.append(key)
            return
        key, size = self._main.popitem(last=False)
        hits = self._hits[key]
        if hits > 0:
            self._hits[key] = hits - 1
            self._main[key] = size
        else:
            del self._hits[key]
            self._main_used -= size
            evicted.append(key)
