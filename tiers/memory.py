"""In-process byte store (L1): bounded by bytes and entries, TTL per entry, tag index, pluggable eviction.

Design:

- Entries live in one dict; an entry's size for the policy is ``len(value)`` (stats report the same bytes).
  The byte bound is the policy's ``capacity``; the policy decides admission and which keys leave.
- ``max_entries`` is a second bound. :class:`~tiers.policies.base.EvictionPolicy` only names victims when
  bytes overflow, so for the entry bound the store asks ``policy.victim()`` when a policy offers it and
  otherwise evicts the oldest-inserted entry (dict order, O(1)).
- TTL: a read of an expired entry removes it (lazy); every write also pops due entries off a min-heap of
  expiry times (amortized sweep, at most ``sweep_batch`` per write), so memory held by expired entries that
  nobody reads is reclaimed without a timer. Stale heap items (overwritten or deleted keys) are skipped and
  the heap is rebuilt when it grows past twice the live entries.
- Tags: ``tag -> {key: None}`` (a dict of strings rather than a set: see below), cleaned on every removal, so
  ``keys_with_tag`` never returns dead keys.
- Entries pushed out by the bounds (not TTL expiry, deletion or invalidation) go to ``on_evict(key, value,
  tags, cost, ttl)`` — ``ttl`` is the remaining lifetime (``None`` = none) so a demoted copy does not outlive
  the original. The callback runs synchronously and must not block (``tiers.demotion.Demoter.offer``
  qualifies).
- The ``*_nowait`` methods are the synchronous fast path (no await on an L1 hit); the async methods of the
  :class:`~tiers.storage.KeyValueStore` contract call them.
- Nothing per entry is an object the cyclic garbage collector tracks, so that its full collections, which stall
  the event loop, do not grow with the entries held. An entry is a plain tuple of atoms (bytes, floats, a tuple
  of tag strings), as are the policies' records of it (:mod:`tiers.policies`): the collector stops tracking such
  tuples at their first young collection. The tag index is a dict of dicts of strings, which the collector never
  tracks (sets it always does, and walks every member). An object per entry (a slotted class, a frozenset of
  tags, a mutable list in the policy) and tag sets made each full collection walk about 3 objects and 9
  references per entry: 160-400 ms at 200,000 entries on a 2-core machine, against 10-40 ms now (``python -m
  loadtest.bench l1``'s ``gc_full_ms``, BENCHMARKS.md).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tiers.policies.base import EvictionPolicy
from tiers.storage import StoreStats, check_ttl


class EvictionListener(Protocol):
    """Receives entries pushed out by the store's bounds."""

    def __call__(self, key: str, value: bytes, tags: frozenset[str], cost: float, ttl: float | None) -> None: ...


_Entry = tuple[bytes, float | None, tuple[str, ...], float, float]
"""(value, expires_at, tags, cost, stored_at): a tuple of atoms, untracked by the garbage collector."""


class MemoryStore:
    """In-process ``KeyValueStore`` driven by an :class:`EvictionPolicy`."""

    name = "memory"

    def __init__(
        self,
        policy: EvictionPolicy,
        max_entries: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_evict: EvictionListener | None = None,
        sweep_batch: int = 32,
    ) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError("max_entries must be at least 1 (None = unbounded)")
        self.policy = policy
        self.max_entries = max_entries
        self.on_evict = on_evict
        self._clock = clock
        self._sweep_batch = sweep_batch
        self._entries: dict[str, _Entry] = {}
        self._tags: dict[str, dict[str, None]] = {}
        self._expiries: list[tuple[float, str]] = []
        self._bytes = 0
        self.evictions = 0
        self.expirations = 0

    # -- synchronous fast path -------------------------------------------------------------------------------

    def get_nowait(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at = entry[1]
        if expires_at is not None and expires_at <= self._clock():
            self._remove(key)
            self.policy.remove(key)
            self.expirations += 1
            return None
        self.policy.hit(key)
        return entry[0]

    def age_nowait(self, key: str) -> float | None:
        """Seconds since ``key`` was stored, ``None`` when absent (no expiry check, no policy hit)."""
        entry = self._entries.get(key)
        return None if entry is None else self._clock() - entry[4]

    def put_nowait(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool:
        check_ttl(ttl)
        now = self._clock()
        self._sweep(now)
        if key in self._entries:
            self._remove(key)
        decision = self.policy.insert(key, len(value), cost)
        for victim in decision.evicted:
            self._evict(victim, now)
        if not decision.admitted:
            self.policy.remove(key)
            return False
        expires_at = None if ttl is None else now + ttl
        value, tags = bytes(value), tuple(set(tags))
        self._entries[key] = (value, expires_at, tags, cost, now)
        self._bytes += len(value)
        for tag in tags:
            self._tags.setdefault(tag, {})[key] = None
        if expires_at is not None:
            heapq.heappush(self._expiries, (expires_at, key))
        if self.max_entries is not None:
            while len(self._entries) > self.max_entries:
                victim = self._entry_victim()
                self.policy.remove(victim)
                self._evict(victim, now)
        return True

    def delete_nowait(self, key: str) -> bool:
        if key not in self._entries:
            return False
        self._remove(key)
        self.policy.remove(key)
        return True

    def keys_with_tag_nowait(self, tag: str) -> list[str]:
        now = self._clock()
        live: list[str] = []
        for key in list(self._tags.get(tag, ())):
            expires_at = self._entries[key][1]
            if expires_at is not None and expires_at <= now:
                self.delete_nowait(key)
                self.expirations += 1
            else:
                live.append(key)
        return live

    def delete_tag_nowait(self, tag: str) -> int:
        keys = self.keys_with_tag_nowait(tag)
        for key in keys:
            self.delete_nowait(key)
        return len(keys)

    def clear_nowait(self) -> int:
        count = self.live_count(self._clock())
        for key in list(self._entries):
            self.delete_nowait(key)
        self._expiries.clear()
        return count

    def stats_nowait(self) -> StoreStats:
        self._sweep(self._clock(), limit=None)
        return StoreStats(entries=len(self._entries), bytes=self._bytes)

    def live_count(self, now: float) -> int:
        return sum(1 for e in self._entries.values() if e[1] is None or e[1] > now)

    def __len__(self) -> int:
        return len(self._entries)

    # -- KeyValueStore ---------------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return self.get_nowait(key)

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool:
        return self.put_nowait(key, value, ttl=ttl, tags=tags, cost=cost)

    async def delete(self, key: str) -> bool:
        return self.delete_nowait(key)

    async def keys_with_tag(self, tag: str) -> list[str]:
        return self.keys_with_tag_nowait(tag)

    async def delete_tag(self, tag: str) -> int:
        return self.delete_tag_nowait(tag)

    async def clear(self) -> int:
        return self.clear_nowait()

    async def stats(self) -> StoreStats:
        return self.stats_nowait()

    async def close(self) -> None:
        return None

    # -- internals -------------------------------------------------------------------------------------------

    def _entry_victim(self) -> str:
        victim_of = getattr(self.policy, "victim", None)
        if callable(victim_of):
            victim = victim_of()
            if isinstance(victim, str) and victim in self._entries:
                return victim
        return next(iter(self._entries))  # the newcomer is last: max_entries >= 1 keeps it off this path

    def _remove(self, key: str) -> _Entry:
        entry = self._entries.pop(key)
        self._bytes -= len(entry[0])
        for tag in entry[2]:
            keys = self._tags.get(tag)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._tags[tag]
        return entry

    def _evict(self, key: str, now: float) -> None:
        if key not in self._entries:
            return
        value, expires_at, tags, cost, _ = self._remove(key)
        self.evictions += 1
        if expires_at is not None and expires_at <= now:
            self.expirations += 1
            return
        if self.on_evict is not None:
            self.on_evict(key, value, frozenset(tags), cost, None if expires_at is None else expires_at - now)

    def _sweep(self, now: float, limit: int | None = -1) -> None:
        """Remove up to ``limit`` due entries (-1: the configured batch; None: all)."""
        budget = self._sweep_batch if limit == -1 else limit
        heap = self._expiries
        while heap and heap[0][0] <= now and (budget is None or budget > 0):
            expires_at, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is not None and entry[1] == expires_at:
                self._remove(key)
                self.policy.remove(key)
                self.expirations += 1
            if budget is not None:
                budget -= 1
        if len(heap) > 2 * len(self._entries) + 64:
            self._expiries = [(e[1], k) for k, e in self._entries.items() if e[1] is not None]
            heapq.heapify(self._expiries)
