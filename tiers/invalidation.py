"""Invalidation: removing cached answers (and cached searches) that the knowledge no longer supports.

A :class:`Selector` names what should go; its parts combine with AND (within a part, alternatives combine with
OR: any of the ``keys``, any of the ``documents``). An empty selector selects nothing — flushing is a separate,
explicit operation (:meth:`Invalidator.flush`).

How entries are found, per response tier, without reading every entry when the selector allows it:

1. candidate keys come from the store's tag index (``tiers.storage.KeyValueStore.keys_with_tag``) — the tags
   every entry carries (``proxy.answers.replies.entry_tags``): ``tenant:<t>``, ``ns:<t>/<ns>``, ``model:<m>``,
   ``doc:<id>`` (the document reverse index), ``response:<id>`` (a stored response's own id and the one it
   continues), ``collection:<c>``, ``all``; or from ``keys`` directly. Every tag
   part of the selector narrows the set (set intersection); the ``all`` tag is used only when no part maps to
   a tag;
2. parts that tags cannot answer are checked on the decoded entry header (:class:`~tiers.entry.CachedResponse`):
   a namespace without a tenant (``meta["namespace"]``), age (``created``), and the semantic radius;
3. a semantic radius (``near``: a query text and a cosine distance) embeds the query and the candidates'
   stored questions with the semantic tier's embedder and keeps those with ``1 - cosine <= radius``. It needs
   an embedder (the runtime's semantic tier); without one such a selector is refused
   (:class:`InvalidSelector`).

When a single tag says it all (e.g. only a tenant and namespace, or one model), each tier removes it with one
``delete_tag`` call — one broadcast in shared mode — instead of key by key.

Deleted keys are also handed to the semantic index (``SemanticIndex.delete``) so no vector points at a gone
answer. Cached Qdrant searches live in the retrieval cache, whose own index knows which collection and which
point ids each result read: a ``collection`` selector drops every cached search of that collection, and
``documents`` (with the ids that are Qdrant point ids — integers or UUIDs) drops the searches whose result
contained one of them, in the given collection or, without one, in every collection the ``collections``
callable lists. The retrieval cache is not scoped by tenant, namespace or model, so those parts do not narrow
it; over-invalidating a search is always safe.

The decisions (:func:`matches`, :func:`candidate_tags`) are pure; :class:`Invalidator` is the thin async driver.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tiers.entry import CachedResponse, CorruptEntry
from tiers.response_tier import ResponseTier
from tiers.retrieval.writes import PointId, WriteEffect, WriteScope, canonical_point_id

ALL_TAG = "all"
_YIELD_EVERY = 500


class InvalidSelector(ValueError):
    """A selector that cannot be applied (e.g. a semantic radius without a semantic tier)."""


@dataclass(frozen=True, slots=True)
class Near:
    """Entries whose stored question lies within ``radius`` (cosine distance, 0..2) of ``text``."""

    text: str
    radius: float


@dataclass(frozen=True, slots=True)
class Selector:
    """What to invalidate; every given part must hold (AND)."""

    keys: tuple[str, ...] = ()
    tenant: str | None = None
    namespace: str | None = None
    model: str | None = None
    documents: tuple[str, ...] = ()
    responses: tuple[str, ...] = ()
    """Entries carrying any of these Responses API ids (a stored response, or an answer continuing one)."""
    collection: str | None = None
    near: Near | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None

    @property
    def empty(self) -> bool:
        return not (self.keys or self.tenant or self.namespace or self.model or self.documents or self.responses
                    or self.collection or self.near or self.older_than_s is not None or self.newer_than_s is not None)

    @property
    def needs_entry(self) -> bool:
        """Whether tags alone cannot decide (the decoded header must be read)."""
        return (self.namespace is not None and self.tenant is None) or self.near is not None \
            or self.older_than_s is not None or self.newer_than_s is not None


def candidate_tags(selector: Selector) -> list[list[str]]:
    """Tag groups to intersect: each inner list is OR-ed (union of its tags' keys), groups are AND-ed."""
    groups: list[list[str]] = []
    if selector.tenant is not None:
        if selector.namespace is not None:
            groups.append([f"ns:{selector.tenant}/{selector.namespace}"])
        else:
            groups.append([f"tenant:{selector.tenant}"])
    if selector.model is not None:
        groups.append([f"model:{selector.model}"])
    if selector.documents:
        groups.append([f"doc:{doc}" for doc in selector.documents])
    if selector.responses:
        groups.append([f"response:{response}" for response in selector.responses])
    return groups


def single_tag(selector: Selector) -> str | None:
    """The one tag that selects exactly the entries of ``selector``, when there is one."""
    groups = candidate_tags(selector)
    if selector.keys or selector.needs_entry or selector.collection is not None or len(groups) != 1:
        return None
    return groups[0][0] if len(groups[0]) == 1 else None


def matches(selector: Selector, entry: CachedResponse, now: float) -> bool:
    """The header checks of a selector (tags already narrowed the candidates; ``near`` is checked apart)."""
    if selector.namespace is not None and entry.meta.get("namespace") != selector.namespace:
        return False
    if selector.tenant is not None and "tenant" in entry.meta and entry.meta["tenant"] != selector.tenant:
        return False
    age = entry.age(now)
    if selector.older_than_s is not None and age < selector.older_than_s:
        return False
    return not (selector.newer_than_s is not None and age > selector.newer_than_s)


def within_radius(query: npt.NDArray[np.float32], vectors: npt.NDArray[np.float32], radius: float) -> list[bool]:
    """Whether each row of ``vectors`` is within cosine distance ``radius`` of ``query``."""
    q = query / (np.linalg.norm(query) or 1.0)
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0
    similarity = (vectors / norms[:, None]) @ q
    return [bool(1.0 - s <= radius + 1e-9) for s in similarity]


class Embedding(Protocol):
    """What a semantic radius needs: the semantic tier's embedder."""

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


class SemanticIndex(Protocol):
    """The semantic tier's vector index (``tiers.semantic.SemanticTier`` fits)."""

    async def delete(self, entry_keys: Sequence[str]) -> int: ...


class SearchResultCache(Protocol):
    """The retrieval cache (``tiers.retrieval.cache.RetrievalCache`` fits)."""

    async def invalidate(self, effect: WriteEffect) -> int: ...


@dataclass(slots=True)
class Removal:
    """How many entries went, per tier (``semantic`` counts vectors, ``retrieval`` cached searches)."""

    removed: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.removed.values())

    def add(self, other: Removal) -> None:
        """Count ``other``'s removals in this removal too."""
        self.removed.update(other.removed)
        self.keys = sorted({*self.keys, *other.keys})


class Invalidator:
    """Applies selectors and flushes over response tiers, the semantic index and the retrieval cache."""

    def __init__(self, tiers: Sequence[ResponseTier], *, semantic: SemanticIndex | None = None,
                 embedder: Embedding | None = None, retrieval: SearchResultCache | None = None,
                 collections: Callable[[], Iterable[str]] | None = None,
                 clock: Callable[[], float] | None = None,
                 on_removed: Callable[[list[str]], None] | None = None) -> None:
        """``semantic``: forget vectors of removed keys; ``embedder``: enables ``near``; ``retrieval`` and
        ``collections``: cached searches and the collections they read; ``on_removed``: told every removed key."""
        self.tiers = list(tiers)
        self.semantic = semantic
        self.embedder = embedder
        self.retrieval = retrieval
        self.collections = collections
        self.on_removed = on_removed
        self._clock = clock or time.time

    def tier(self, name: str) -> ResponseTier | None:
        return next((t for t in self.tiers if t.name == name), None)

    async def invalidate(self, selector: Selector) -> Removal:
        if selector.near is not None and self.embedder is None:
            raise InvalidSelector("a semantic radius needs the semantic tier, which this proxy does not run")
        removal = Removal()
        if selector.empty:
            return removal
        removed: set[str] = set()
        whole_tag = single_tag(selector)
        for tier in self.tiers:
            if whole_tag is not None:  # one tag says it all: one removal (one broadcast in shared mode)
                removed.update(await tier.store.keys_with_tag(whole_tag))
                removal.removed[tier.name] = await tier.delete_tag(whole_tag)
                continue
            count = 0
            for key in await self._select(tier, selector):
                if await tier.delete(key):
                    count += 1
                    removed.add(key)
            removal.removed[tier.name] = count
        removal.keys = sorted(removed)
        await self._after_removal(removal)
        if self.retrieval is not None and (selector.collection is not None or selector.documents):
            removal.removed["retrieval"] = await self._invalidate_searches(selector)
        return removal

    async def delete_keys(self, keys: Sequence[str]) -> Removal:
        """Remove these keys from every tier."""
        return await self.invalidate(Selector(keys=tuple(keys)))

    async def flush(self, names: Sequence[str] | None = None) -> Removal:
        """Empty the named tiers (all when ``None``); ``retrieval`` flushes cached searches.

        The removal names only what was flushed: emptying one answer tier leaves the semantic index alone (its
        vectors still point at the answers the other tiers hold; one whose answer is gone everywhere is dropped
        when it is next matched), and only a flush of everything forgets the vectors of the removed answers."""
        known = {t.name for t in self.tiers} | ({"retrieval"} if self.retrieval is not None else set())
        wanted = list(known) if names is None else list(names)
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise InvalidSelector(f"unknown tier(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        removal = Removal()
        removed: set[str] = set()
        for tier in self.tiers:
            if tier.name not in wanted:
                continue
            keys = await tier.store.keys_with_tag(ALL_TAG)
            removal.removed[tier.name] = await tier.store.clear()
            removed.update(keys)
        removal.keys = sorted(removed)
        if names is None:
            await self._after_removal(removal)
        elif self.on_removed is not None and removal.keys:
            self.on_removed(removal.keys)
        if self.retrieval is not None and "retrieval" in wanted:
            removal.removed["retrieval"] = await self.retrieval.invalidate(WriteEffect(WriteScope.ALL))
        return removal

    async def _after_removal(self, removal: Removal) -> None:
        if not removal.keys:
            return
        if self.semantic is not None:
            removal.removed["semantic"] = await self.semantic.delete(removal.keys)
        if self.on_removed is not None:
            self.on_removed(removal.keys)

    async def _select(self, tier: ResponseTier, selector: Selector) -> list[str]:
        store = tier.store
        candidates: set[str] | None = set(selector.keys) if selector.keys else None
        groups = candidate_tags(selector)
        if selector.collection is not None:
            groups.append([f"collection:{selector.collection}"])
        for group in groups:
            found: set[str] = set()
            for tag in group:
                found.update(await store.keys_with_tag(tag))
            candidates = found if candidates is None else candidates & found
        if candidates is None:
            candidates = set(await store.keys_with_tag(ALL_TAG))
        if not selector.needs_entry:
            return sorted(candidates)
        now = self._clock()
        kept: list[tuple[str, CachedResponse]] = []
        for index, key in enumerate(sorted(candidates)):
            if index % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)  # long scans must not starve the data plane
            raw = await store.get(key)
            if raw is None:
                continue
            try:
                entry = CachedResponse.decode(raw)
            except CorruptEntry:
                kept.append((key, CachedResponse(body=b"", kind="corrupt")))  # corrupt entries go too
                continue
            if matches(selector, entry, now):
                kept.append((key, entry))
        if selector.near is not None:
            return await self._near(selector.near, kept)
        return [key for key, _ in kept]

    async def _near(self, near: Near, entries: list[tuple[str, CachedResponse]]) -> list[str]:
        assert self.embedder is not None
        asked = [(key, str(entry.meta["question"])) for key, entry in entries
                 if isinstance(entry.meta.get("question"), str)]
        if not asked:
            return []
        vectors = np.asarray(await self.embedder.embed([near.text, *(q for _, q in asked)]), dtype=np.float32)
        inside = within_radius(vectors[0], vectors[1:], near.radius)
        return [key for (key, _), ok in zip(asked, inside, strict=True) if ok]

    async def _invalidate_searches(self, selector: Selector) -> int:
        assert self.retrieval is not None
        if selector.documents:
            ids = frozenset(pid for pid in (_point_id(doc) for doc in selector.documents) if pid is not None)
            if not ids:
                return 0
            names = [selector.collection] if selector.collection is not None else \
                list(self.collections() if self.collections is not None else ())
            dropped = 0
            for name in names:
                dropped += await self.retrieval.invalidate(WriteEffect(WriteScope.PAYLOAD_CHANGED, name, ids))
            return dropped
        if selector.collection is not None:
            return await self.retrieval.invalidate(WriteEffect(WriteScope.COLLECTION, selector.collection))
        return 0


def _point_id(doc: str) -> PointId | None:
    """A document id as a Qdrant point id: an integer string becomes an int, a UUID is canonicalized."""
    if doc.isdigit():
        return int(doc)
    return canonical_point_id(doc)

