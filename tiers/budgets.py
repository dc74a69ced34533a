"""Byte budgets of the structures users name or fill, and the memory ledger that shows them.

Every structure a client can grow (semantic-index partitions, question templates, calibration evidence, search
results, ...) keeps within a byte budget and reports a :class:`MemoryAccount`: the bytes it holds, its budget and
the setting that sets it. Each registers once with the process's :class:`MemoryLedger`; ``/admin/stats``
(``memory``) and ``/metrics`` (``ragproxy_memory_bytes``, ``ragproxy_memory_budget_bytes``) list its lines.

What leaves when a budget is full is decided by :class:`OwnedLRU`, one rule for every such structure: the least
recently used item of the **owner holding the most bytes** (an owner is a tenant). One client naming thousands of
namespaces then pushes out its own items once it holds more than anyone else, never first another tenant's. Pure:
sizes are what the structures say they hold, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class MemoryAccount:
    """One structure's line of the ledger."""

    name: str
    bytes: int
    """Held now (an estimate from sizes measured once: see each structure's docs)."""
    budget: int
    """The most it holds (:attr:`setting`)."""
    entries: int
    setting: str
    """The setting (or constant) that sets :attr:`budget`."""

    def as_dict(self) -> dict[str, int | str]:
        return {"bytes": self.bytes, "budget": self.budget, "entries": self.entries, "setting": self.setting}


@runtime_checkable
class Accounted(Protocol):
    """A structure that reports its memory."""

    def memory(self) -> list[MemoryAccount]:
        """Its lines of the ledger."""
        ...


class OwnedLRU(Generic[K]):
    """Items with an owner and a size in bytes, in order of use; names the item to evict (module docstring)."""

    def __init__(self) -> None:
        self._owners: dict[str, OrderedDict[K, int]] = {}
        """Owner → its items (least recently used first) and their sizes."""
        self._owner_bytes: dict[str, int] = {}
        self._owner_of: dict[K, str] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._owner_of)

    def __contains__(self, item: object) -> bool:
        return item in self._owner_of

    def __iter__(self) -> Iterator[K]:
        """Every item, owner by owner, least recently used first within each."""
        return (item for items in self._owners.values() for item in items)

    def size(self, item: K) -> int:
        owner = self._owner_of.get(item)
        return self._owners[owner][item] if owner is not None else 0

    def set(self, item: K, owner: str, size: int) -> None:
        """Record ``item`` (``size`` bytes) as just used."""
        self.remove(item)
        self._owners.setdefault(owner, OrderedDict())[item] = size
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + size
        self._owner_of[item] = owner
        self.bytes += size

    def resize(self, item: K, size: int) -> None:
        """``item`` now holds ``size`` bytes (its place in the order is kept)."""
        owner = self._owner_of[item]
        items = self._owners[owner]
        change = size - items[item]
        items[item] = size
        self._owner_bytes[owner] += change
        self.bytes += change

    def touch(self, item: K) -> None:
        """``item`` was just used."""
        owner = self._owner_of.get(item)
        if owner is not None:
            self._owners[owner].move_to_end(item)

    def remove(self, item: K) -> int:
        """Forget ``item``; the bytes it held."""
        owner = self._owner_of.pop(item, None)
        if owner is None:
            return 0
        items = self._owners[owner]
        size = items.pop(item)
        self.bytes -= size
        if items:
            self._owner_bytes[owner] -= size
        else:
            del self._owners[owner], self._owner_bytes[owner]
        return size

    def victim(self, keep: K | None = None) -> K | None:
        """The least recently used item other than ``keep`` of the owner holding the most bytes; ``None`` when that
        owner holds ``keep`` alone (or nothing is held)."""
        if not self._owner_bytes:
            return None
        owner = max(self._owner_bytes, key=self._owner_bytes.__getitem__)
        return next((item for item in self._owners[owner] if item != keep), None)


@dataclass(frozen=True, slots=True)
class Measured:
    """The ledger line of a structure that keeps its own count of bytes (read at each report)."""

    name: str
    read: Callable[[], tuple[int, int]]
    """(bytes, entries) now."""
    budget: int
    setting: str

    def memory(self) -> list[MemoryAccount]:
        held, entries = self.read()
        return [MemoryAccount(self.name, held, self.budget, entries, self.setting)]


class MemoryLedger:
    """Every structure of the process that reports its memory, registered once where it is built."""

    def __init__(self) -> None:
        self._parts: list[Accounted] = []

    def register(self, part: Accounted) -> None:
        self._parts.append(part)

    def accounts(self) -> list[MemoryAccount]:
        return [account for part in self._parts for account in part.memory()]

    def report(self) -> dict[str, dict[str, int | str]]:
        """Each structure's line, by name (``/admin/stats``' ``memory``)."""
        return {account.name: account.as_dict() for account in self.accounts()}
