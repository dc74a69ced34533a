"""A ghost list: ids of entries recently evicted unused, remembered (without their data) for a bounded number
of bytes.

S3-FIFO and BP-Cache use it to recognise a key that comes back soon after it was dropped from the small
observation queue: such a key skips observation and goes straight to the main cache. The bound is in bytes of
the forgotten entries (oldest forgotten first) so that it scales with the cache it serves, whatever the entry
sizes.
"""

from __future__ import annotations

from collections import OrderedDict


class GhostList:
    """FIFO of recently evicted keys with their sizes, bounded by the sum of those sizes."""

    __slots__ = ("_bytes", "_keys", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str, size: int) -> None:
        """Remember ``key``; forget the oldest keys beyond the byte bound."""
        old = self._keys.pop(key, None)
        if old is not None:
            self._bytes -= old
        self._keys[key] = size
        self._bytes += size
        while self._bytes > self.capacity and self._keys:
            self._bytes -= self._keys.popitem(last=False)[1]

    def take(self, key: str) -> bool:
        """Forget ``key``; whether it was remembered."""
        size = self._keys.pop(key, None)
        if size is None:
            return False
        self._bytes -= size
        return True
