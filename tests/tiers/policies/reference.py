"""The straightforward GreedyDual (Landlord) algorithm: charge every resident entry rent, O(n) per eviction.

A test oracle for ``tiers.policies.greedydual``: written to mirror the algorithm's definition as plainly as
possible, with exact rational arithmetic when given ``Fraction`` costs.
"""

from __future__ import annotations

from fractions import Fraction

from tiers.policies.base import Decision


class ReferenceGreedyDual:
    """Landlord by definition: credits, rent charged to every entry, zero-credit entries out."""

    name = "reference-greedydual"

    def __init__(self, capacity: int, frequency: bool = False, bypass: bool = True) -> None:
        self.capacity = capacity
        self.frequency = frequency
        self.bypass = bypass
        self.sizes: dict[str, int] = {}
        self.costs: dict[str, Fraction] = {}
        self.reads: dict[str, int] = {}
        self.credits: dict[str, Fraction] = {}

    @property
    def used(self) -> int:
        return sum(self.sizes.values())

    def __len__(self) -> int:
        return len(self.sizes)

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    def credit(self, key: str) -> Fraction:
        return self.credits[key]

    def insert(self, key: str, size: int, cost: Fraction) -> Decision:
        self.remove(key)
        if size > self.capacity:
            return Decision(admitted=False)
        newcomer = Fraction(cost)
        evicted: list[str] = []
        while self.used + size > self.capacity:
            per_byte = [self.credits[k] / max(self.sizes[k], 1) for k in self.sizes]
            if self.bypass:
                per_byte.append(newcomer / max(size, 1))
            rent = min(per_byte)
            for k in self.sizes:
                self.credits[k] -= rent * max(self.sizes[k], 1)
            if self.bypass:
                newcomer -= rent * max(size, 1)
            for k in [k for k in self.sizes if self.credits[k] == 0]:
                self.remove(k)
                evicted.append(k)
            if self.bypass and newcomer == 0:
                return Decision(admitted=False, evicted=tuple(evicted))
        self.sizes[key], self.costs[key], self.reads[key] = size, Fraction(cost), 1
        self.credits[key] = newcomer
        return Decision(admitted=True, evicted=tuple(evicted))

    def hit(self, key: str) -> None:
        if key in self.sizes:
            self.reads[key] += 1
            self.credits[key] = self.costs[key] * (self.reads[key] if self.frequency else 1)

    def remove(self, key: str) -> None:
        if key in self.sizes:
            for table in (self.sizes, self.costs, self.reads, self.credits):
                del table[key]
