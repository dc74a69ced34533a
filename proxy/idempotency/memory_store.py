"""The idempotency store of embedded mode: records in this process's memory, bounded as
:mod:`proxy.idempotency.records` says."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.idempotency.records import Claim, Claimed, Full, Record, decide, held_bytes
from proxy.idempotency.settings import IdempotencySettings

_SETTINGS = IdempotencySettings()  # the defaults, defined once there




class MemoryIdempotencyStore:
    """Records in this process, each until its expiry, bounded per user and in all, in keys and in bytes (see the
    module docstring).

    Per user, an ordered map key → (record, expiry), oldest first; users are also filed by how many keys they hold,
    so that the one holding the most is found at once when the whole store is full of keys."""

    def __init__(self, max_entries: int = _SETTINGS.max_entries, per_user: int = _SETTINGS.max_entries_per_user, *,
                 max_bytes: int = _SETTINGS.max_bytes, max_bytes_per_user: int = _SETTINGS.max_bytes_per_user,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.per_user = per_user
        self.max_bytes = max_bytes
        self.max_bytes_per_user = max_bytes_per_user
        self.clock = clock
        self._users: dict[str, OrderedDict[str, tuple[Record, float]]] = {}
        self._by_size: dict[int, set[str]] = {}
        self._held: dict[str, int] = {}
        self.entries = 0
        self.bytes = 0

    def _get(self, scope: str, key: str) -> Record | None:
        records = self._users.get(scope)
        held = records.get(key) if records is not None else None
        if held is None:
            return None
        if held[1] <= self.clock():
            self._drop(scope, key)
            return None
        return held[0]

    def _file(self, scope: str, before: int, after: int) -> None:
        """Move ``scope`` from the users holding ``before`` keys to those holding ``after``."""
        if before:
            self._by_size[before].discard(scope)
            if not self._by_size[before]:
                del self._by_size[before]
        if after:
            self._by_size.setdefault(after, set()).add(scope)

    def _count(self, scope: str, key: str, record: Record, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) a record's bytes from its user's and the store's."""
        if record.answer is None:
            return
        size = sign * held_bytes(key, record.answer)
        self.bytes += size
        self._held[scope] = self._held.get(scope, 0) + size
        if not self._held[scope]:
            del self._held[scope]

    def _drop(self, scope: str, key: str) -> None:
        records = self._users[scope]
        record, _ = records.pop(key)
        self._count(scope, key, record, -1)
        self.entries -= 1
        self._file(scope, len(records) + 1, len(records))
        if not records:
            del self._users[scope]

    def _evict_one(self, scope: str) -> bool:
        """Drop the oldest expired or finished record of ``scope`` (never a running claim); ``False``: none."""
        now = self.clock()
        for key, (record, expiry) in self._users.get(scope, OrderedDict()).items():
            if expiry <= now or not record.running:
                self._drop(scope, key)
                return True
        return False

    def _make_room(self, scope: str, keys: int = 0, size: int = 0) -> bool:
        """Evict until ``scope`` can hold ``keys`` more keys and ``size`` more bytes; ``False``: it cannot."""
        while len(self._users.get(scope, ())) + keys > self.per_user \
                or self._held.get(scope, 0) + size > self.max_bytes_per_user:
            if not self._evict_one(scope):
                return False
        while self.entries + keys > self.max_entries:
            largest_first = [user for count in sorted(self._by_size, reverse=True) for user in self._by_size[count]]
            if not any(self._evict_one(user) for user in largest_first):
                return False
        while self.bytes + size > self.max_bytes:  # the user holding the most bytes first; among equals, others
            most_first = sorted(self._held, key=lambda user: (self._held[user], user != scope), reverse=True)
            if not any(self._evict_one(user) for user in most_first):
                return False
        return True

    def _set(self, scope: str, key: str, record: Record, ttl_s: float) -> None:
        records = self._users.setdefault(scope, OrderedDict())
        held = records.get(key)
        records[key] = (record, self.clock() + ttl_s)
        self._count(scope, key, record, 1)
        if held is not None:
            self._count(scope, key, held[0], -1)
            return
        self.entries += 1
        self._file(scope, len(records) - 1, len(records))

    async def claim(self, scope: str, key: str, print_: str, owner: str, running_ttl_s: float) -> Claim:
        held = self._get(scope, key)
        claim = decide(held, print_, owner)
        if isinstance(claim, Claimed) and held is None:
            if not self._make_room(scope, keys=1):
                return Full()
            self._set(scope, key, Record(print_, owner), running_ttl_s)
        return claim

    async def keep(self, scope: str, key: str, owner: str, answer: bytes, ttl_s: float) -> bool:
        held = self._get(scope, key)
        if held is None or not held.running or held.owner != owner:
            return False
        size = held_bytes(key, answer)
        if size > min(self.max_bytes_per_user, self.max_bytes) or not self._make_room(scope, size=size):
            self._drop(scope, key)
            return False
        self._set(scope, key, Record(held.fingerprint, owner, answer), ttl_s)
        return True

    async def free(self, scope: str, key: str, owner: str) -> None:
        held = self._get(scope, key)
        if held is not None and held.running and held.owner == owner:
            self._drop(scope, key)

    async def close(self) -> None:
        self._users.clear()
        self._by_size.clear()
        self._held.clear()
        self.entries = 0
        self.bytes = 0
