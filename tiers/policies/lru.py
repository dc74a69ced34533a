"""Least-recently-used eviction: the baseline every other policy is measured against.

FIFO with one difference: a read moves the entry to the young end, so the victim is the entry read or written
least recently.
"""

from __future__ import annotations

from tiers.policies.fifo import FIFOPolicy


class LRUPolicy(FIFOPolicy):
    """Evicts the entry read or written least recently; admits everything that fits at all."""

    name = "lru"

    def hit(self, key: str) -> None:
        if key in self._sizes:
            self._sizes.move_to_end(key)
