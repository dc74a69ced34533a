"""Knowledge versions: a counter per (tenant, namespace) that is part of every cache key.

Bumping a version (the admin's "the knowledge changed") makes every older entry unreachable at once — no scan, no
race with in-flight stores, since an answer stored under the old version can never be read under the new one.
Embedded mode keeps the counters in memory; shared mode keeps them in Redis (see ``tiers.redis_versions``).
"""

from __future__ import annotations

from typing import Protocol


class VersionSource(Protocol):
    """Where the current knowledge version of a scope is read (synchronously: it is on the hot path)."""

    def current(self, tenant: str, namespace: str) -> str: ...

    async def bump(self, tenant: str, namespace: str) -> str:
        """Make every older entry of the scope unreachable; the new version (returns once it holds everywhere)."""
        ...


class KnowledgeVersions:
    """In-process version counters."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], int] = {}

    def current(self, tenant: str, namespace: str) -> str:
        return str(self._versions.get((tenant, namespace), 0))

    async def bump(self, tenant: str, namespace: str) -> str:
        value = self._versions.get((tenant, namespace), 0) + 1
        self._versions[(tenant, namespace)] = value
        return str(value)
