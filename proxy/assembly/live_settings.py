"""Settings that change while the proxy runs (``PATCH /admin/config``), applied in place by the parts that own them.

:data:`LIVE_KEYS` are the settings that may change without a restart. Each part that reads one of them is a
:class:`Configurable`: it names the keys it owns (``live_keys``) and applies new settings to itself in
``configure``. Every owner is registered once, where it is made — the stages by
:func:`proxy.assembly.pipelines.build_pipelines`,
the access log and the log level by the runtime — in the runtime's :class:`LiveSettings`. A patch is validated
into a whole new :class:`~proxy.assembly.config.Settings` (the same rules and messages as at start-up), then
:meth:`LiveSettings.apply` hands it to the owners of the keys it changes. Nothing is rebuilt: the pipelines, their
stages and what the stages keep across requests (coalescing flights, stale answers, verified keys) are the same
objects before and after.

When a change takes effect: ``configure`` is synchronous and :meth:`~LiveSettings.apply` configures every owner in
one go, so no request ever sees half a patch. A stage reads its setting when a request reaches it, so a request in
flight during a patch gets the new value at each stage it has not reached yet, and keeps what the stages it has
passed decided:

- ``cache.l1.ttl_s`` (cache_control), ``cache.unknown_fields``, ``cache.cache_sampled`` and
  ``cache.shared_namespaces`` (canonicalize; the per-item caches of embeddings and rerankers read the same): the
  request's cache policy, bypass decision and key are made there, among its first stages, and kept to its end;
- ``cache.coalesce_wait_s``: bounds the waits that start after the patch; a duplicate already waiting keeps its
  bound;
- ``cache.expose_key``: read when the answer's headers are made, on the way back (``X-Cache-Key``);
- ``logging.access_log``: read when a request ends; ``logging.level``: the root logger's, at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from proxy.assembly.config import Settings

LIVE_KEYS: tuple[str, ...] = (
    "cache.l1.ttl_s",
    "cache.cache_sampled",
    "cache.unknown_fields",
    "cache.coalesce_wait_s",
    "cache.expose_key",
    "cache.shared_namespaces",
    "logging.level",
    "logging.access_log",
)
"""The settings ``PATCH /admin/config`` may change, as dotted keys."""


class Configurable(Protocol):
    """A part of the running proxy that owns live settings."""

    @property
    def live_keys(self) -> frozenset[str]:
        """The keys of :data:`LIVE_KEYS` this part reads."""

    def configure(self, section: Any) -> None:
        """Apply the values of :attr:`live_keys` in ``section`` (the settings section they all belong to, already
        validated) to this part, in place."""


Owner = TypeVar("Owner", bound=Configurable)


def section_of(owner: Configurable) -> str:
    """The settings section ``owner``'s live keys belong to (one per owner: it is handed that section alone)."""
    return next(iter(owner.live_keys)).split(".")[0]


class LiveSettings:
    """The owners of live settings, registered once when they are made."""

    def __init__(self) -> None:
        self.owners: list[Configurable] = []

    def register(self, owner: Owner) -> Owner:
        """Add ``owner`` (returned, so that it can be registered where it is made); ``ValueError`` when it claims a
        key that cannot change while the proxy runs."""
        fixed = owner.live_keys - frozenset(LIVE_KEYS)
        if fixed:
            raise ValueError(f"{type(owner).__name__} claims settings that are not live: {sorted(fixed)}")
        if len({key.split(".")[0] for key in owner.live_keys}) != 1:
            raise ValueError(f"{type(owner).__name__} claims settings of more than one section: "
                             f"{sorted(owner.live_keys)}")
        self.owners.append(owner)
        return owner

    def apply(self, settings: Settings, changed: Iterable[str]) -> None:
        """Hand ``settings`` to every owner of a ``changed`` key."""
        keys = frozenset(changed)
        for owner in self.owners:
            if owner.live_keys & keys:
                owner.configure(getattr(settings, section_of(owner)))

    def owning(self, key: str) -> list[Configurable]:
        """The owners of ``key``."""
        return [owner for owner in self.owners if key in owner.live_keys]
