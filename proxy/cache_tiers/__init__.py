"""The cache tiers of one process: each registered once, in lookup order.

The assembly asks every tier for its stages (in the order of :data:`REGISTERED`: an exact repeat is answered by L1,
then by L3 by key, before L2 computes any embedding), the runtime starts and stops them, and the admin plane
reports, lists and invalidates through them. Adding a tier is a module (a class satisfying
:class:`~proxy.core.cache_tier.CacheTier` and a ``build`` function) plus one line in :data:`REGISTERED` (and its
settings section beside its code). The answer tiers' modules are here; the search cache is whole in
:mod:`proxy.search` (:mod:`proxy.search.tier`), named here by the one function that hands it its settings.

This package is a layer of ``proxy/`` of its own, above the features whose tiers it registers (``answers``,
``search``) and the ones shared mode reads (``kv``, ``observability``), below the assembly that builds it.

A tier that holds whole answers under their exact keys exposes them as ``answers`` (a
:class:`~tiers.response_tier.ResponseTier`): new answers are stored into the first such tier (and copied behind it
by tiers with a ``write_behind``), promoted into the faster ones on a hit in a slower one, listed and invalidated by
the admin plane.
"""

from __future__ import annotations

from proxy.cache_tiers import cold, exact, semantic
from proxy.cache_tiers.base import Build, Builder
from proxy.core.cache_tier import CacheTier, Off
from proxy.search import tier as search


def search_build(b: Build) -> CacheTier | Off:
    """The search cache (:func:`proxy.search.tier.build`) from its part of the settings."""
    return search.build(b.settings.cache.retrieval, cache_enabled=b.settings.cache.enabled,
                        bus=None if b.shared is None else b.shared.bus, fetch_collection=b.fetch_collection)


REGISTERED: tuple[Builder, ...] = (
    exact.build,  # l1: answers by exact key in memory (near copies of Redis in shared mode)
    cold.build,  # l3: answers by exact key on local disk, written behind L1
    semantic.build,  # l2: an equivalent question under the same context points at an answer of L1 or L3
    search_build,  # retrieval: Qdrant searches with nearby query vectors reuse results
)
"""The registered tiers, in lookup order."""
