"""The one storage contract every cache backend implements.

Values are opaque bytes; a tier serializes its entries before they reach a store. Every entry may carry a TTL
(seconds, ``None`` = no expiry) and a set of tags (``tenant:acme``, ``ns:docs``, ``doc:42``, ``model:gpt``...) so that
invalidation can find entries without knowing their keys. ``cost`` is what a miss of this entry would cost (seconds of
upstream latency or price); stores that evict by cost hand it to their eviction policy, others ignore it.

Backends: ``tiers.memory.MemoryStore`` (in-process, policy-driven), ``tiers.redis_store.RedisStore`` (shared mode),
``tiers.cold.ColdStore`` (lz4 + SQLite on local disk). ``tests/tiers/test_store_conformance.py`` is the definition of
"a backend works": every backend is in its parameter list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


def check_ttl(ttl: float | None) -> None:
    """The contract's rule for ``put``: a TTL is positive seconds, or ``None`` for no expiry."""
    if ttl is not None and ttl <= 0:
        raise ValueError("ttl must be positive (None = no expiry)")


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Size of a store: live entries and the bytes their values take."""

    entries: int
    bytes: int


@runtime_checkable
class KeyValueStore(Protocol):
    """Async bytes-in, bytes-out store with TTLs and tags."""

    name: str

    async def get(self, key: str) -> bytes | None:
        """The value, or ``None`` when absent or expired."""

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
    ) -> bool:
        """Store ``value``; ``False`` when the store's admission policy declined it."""

    async def delete(self, key: str) -> bool:
        """Remove one entry; ``True`` if it existed."""

    async def keys_with_tag(self, tag: str) -> list[str]:
        """Keys of the live entries that carry ``tag``."""

    async def delete_tag(self, tag: str) -> int:
        """Remove every entry carrying ``tag``; the number removed."""

    async def clear(self) -> int:
        """Remove everything; the number removed."""

    async def stats(self) -> StoreStats:
        """Entries and bytes held now."""

    async def close(self) -> None:
        """Release connections and files."""
