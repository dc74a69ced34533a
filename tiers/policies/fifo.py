"""First-in-first-out eviction: reads do not matter, the oldest insert goes first. A baseline."""

from __future__ import annotations

from collections import OrderedDict

from tiers.policies.base import Decision
from tiers.policies.greedydual import check_entry

_ADMITTED = Decision(admitted=True)
_BYPASSED = Decision(admitted=False)


class FIFOPolicy:
    """Evicts the entry inserted longest ago; admits everything that fits at all."""

    name = "fifo"

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def insert(self, key: str, size: int, cost: float) -> Decision:
        check_entry(size, cost)
        self.remove(key)
        if size > self.capacity:
            return _BYPASSED
        evicted: list[str] = []
        while self._used + size > self.capacity:
            victim, victim_size = self._sizes.popitem(last=False)
            self._used -= victim_size
            evicted.append(victim)
        self._sizes[key] = size
        self._used += size
        return Decision(admitted=True, evicted=tuple(evicted)) if evicted else _ADMITTED

    def hit(self, key: str) -> None:
        """Reads do not change FIFO order."""

    def remove(self, key: str) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self._used -= size
