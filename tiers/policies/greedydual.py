"""GreedyDual credits (Landlord, GDSF): cost-aware and size-aware eviction in O(log n) per operation.

The straightforward algorithm (Young's Landlord): every entry holds a credit that starts at its cost. When
room is needed, every entry (the newcomer included) pays rent proportional to its size, just enough that the
entry with the least credit per byte reaches zero; entries at zero leave (ties leave together), and rent is
charged again until the newcomer fits. With ``bypass`` a newcomer whose own credit reaches zero is not
admitted (otherwise the newcomer pays no rent and is always admitted, as in GDSF). A hit restores the credit
to ``cost`` (or, with ``frequency``, to ``cost * reads``, reads counting the insert —
GreedyDual-Size-Frequency).

Charging every entry is O(n) per eviction. This module keeps one global ``offset`` instead: the total rent
charged per byte so far. An entry stores its *deadline* ``offset_at_refresh + credit / size`` in a min-heap;
its current credit is ``(deadline - offset) * size``, it runs out exactly when the offset reaches its
deadline, and charging rent is moving the offset to the smallest deadline. The property tests in
``tests/tiers/policies`` check this equals the charge-every-entry algorithm exactly (with rational
arithmetic), for every combination of options.

The heap is ``heapq`` with lazy deletion (it has no decrease-key): each entry ``(size, cost, reads, item)``
keeps the heap item ``(deadline, push number, key)`` that currently stands for it; any other item for that key
is stale (checked by identity) and skipped when it surfaces, and the heap is rebuilt when stale items
outnumber live ones, so memory stays O(n) and each operation O(log n) amortised. The push number breaks ties
deterministically. The heap is inlined here rather than wrapped in a class because method calls dominate the
cost in pure Python. Entries are tuples of atoms, replaced on a hit rather than mutated: the garbage collector
stops tracking them, so they add nothing to its full collections (:mod:`tiers.memory`).

Rent is charged on ``max(size, 1)`` bytes so zero-byte entries cannot live for free. The offset grows with the
total rent charged; with float costs it keeps ample relative precision for any realistic process lifetime.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from tiers.policies.base import Decision

_ADMITTED = Decision(admitted=True)
_BYPASSED = Decision(admitted=False)

_Item = tuple[float, int, str]
_Record = tuple[int, float, int, _Item]
"""(size, cost, reads, heap item) of a resident entry."""


def check_entry(size: int, cost: float) -> None:
    """Reject sizes and costs no policy can reason about."""
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size}")
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")


class GreedyDualPolicy:
    """Evicts the entry whose credit per byte runs out first; optionally bypasses a newcomer that would."""

    name = "greedydual"

    def __init__(self, capacity: int, frequency: bool = False, bypass: bool = True) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.frequency = frequency
        self.bypass = bypass
        self._entries: dict[str, _Record] = {}
        self._heap: list[_Item] = []
        self._pushes = 0
        self._offset: float = 0
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def offset(self) -> float:
        """Rent charged per byte so far."""
        return self._offset

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def credit(self, key: str) -> float:
        """The credit ``key`` has left (KeyError if not resident)."""
        entry = self._entries[key]
        deadline: float = entry[3][0]
        return (deadline - self._offset) * (entry[0] or 1)

    def insert(self, key: str, size: int, cost: float) -> Decision:
        if size < 0 or cost < 0:
            check_entry(size, cost)
        entries = self._entries
        if key in entries:
            self.remove(key)
        capacity = self.capacity
        if size > capacity:
            return _BYPASSED
        offset = self._offset
        deadline = offset + cost / (size or 1)
        if self._used + size <= capacity:
            self._admit(key, size, cost, deadline)
            return _ADMITTED
        heap, bypass, used = self._heap, self.bypass, self._used
        evicted: list[str] = []
        bypassed = False
        while used + size > capacity:  # charge rent round by round; evict whoever runs out
            item = heap[0]
            entry = entries.get(item[2])
            if entry is None or entry[3] is not item:
                heappop(heap)
                continue
            if bypass and deadline <= item[0]:
                offset = deadline
                bypassed = True
                break
            offset = item[0]
            heappop(heap)
            del entries[item[2]]
            used -= entry[0]
            evicted.append(item[2])
        while heap:  # entries tied with the last one to run out leave in the same round
            item = heap[0]
            entry = entries.get(item[2])
            if entry is None or entry[3] is not item:
                heappop(heap)
                continue
            if item[0] > offset:
                break
            heappop(heap)
            del entries[item[2]]
            used -= entry[0]
            evicted.append(item[2])
        self._offset, self._used = offset, used
        if bypassed:
            return Decision(admitted=False, evicted=tuple(evicted))
        if not bypass:  # the newcomer paid no rent
            deadline = offset + cost / (size or 1)
        self._admit(key, size, cost, deadline)
        return Decision(admitted=True, evicted=tuple(evicted))

    def hit(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            size, cost, reads, _ = entry
            credit = cost
            if self.frequency:
                reads += 1
                credit *= reads
            self._pushes += 1
            item = (self._offset + credit / (size or 1), self._pushes, key)
            self._entries[key] = (size, cost, reads, item)
            heappush(self._heap, item)
            if len(self._heap) > 2 * len(self._entries) + 64:
                self._compact()

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used -= entry[0]
            if len(self._heap) > 2 * len(self._entries) + 64:
                self._compact()

    def _admit(self, key: str, size: int, cost: float, deadline: float) -> None:
        self._pushes += 1
        item = (deadline, self._pushes, key)
        self._entries[key] = (size, cost, 1, item)
        heappush(self._heap, item)
        self._used += size
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop stale heap items."""
        self._heap = [entry[3] for entry in self._entries.values()]
        heapify(self._heap)


class LandlordPolicy(GreedyDualPolicy):
    """Landlord: credit = cost, restored on a hit; newcomers that would run out first are bypassed."""

    name = "landlord"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, frequency=False, bypass=True)


class GDSFPolicy(GreedyDualPolicy):
    """GDSF (Cherkasova 1998): priority = offset + reads * cost / size; admits every newcomer that fits."""

    name = "gdsf"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, frequency=True, bypass=False)
