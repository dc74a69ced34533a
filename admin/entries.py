"""Listing, searching and showing cached entries across the response tiers.

Candidates come from the tag index (``tenant:``, ``ns:``, ``model:``, ``doc:`` tags, else ``all``), the rest is
checked on the decoded header (namespace without tenant, age, ``q``: a case-insensitive substring of the stored
question). Keys are listed in sorted order; the cursor is the last key of the page (opaque, base64), so pages
stay stable while entries come and go. Reading an entry goes straight to the store (tier hit/miss counters are
not touched; an in-memory LRU store does count the read as a use).

A search with ``q`` or an age bound decodes every candidate header: O(candidates), for operators, not for the
request path; the scan yields to the event loop every few hundred entries.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from dataclasses import dataclass
from typing import Any

import orjson

from tiers.entry import CachedResponse, CorruptEntry
from tiers.invalidation import ALL_TAG, Selector, candidate_tags, matches
from tiers.response_tier import ResponseTier

MAX_LIMIT = 500
_YIELD_EVERY = 256


@dataclass(frozen=True, slots=True)
class EntryQuery:
    """Filters of ``GET /admin/entries``; all optional, combined with AND."""

    tenant: str | None = None
    namespace: str | None = None
    model: str | None = None
    q: str | None = None
    doc: str | None = None
    min_age_s: float | None = None
    max_age_s: float | None = None
    tier: str | None = None

    def selector(self) -> Selector:
        return Selector(tenant=self.tenant, namespace=self.namespace, model=self.model,
                        documents=(self.doc,) if self.doc else (), older_than_s=self.min_age_s,
                        newer_than_s=self.max_age_s)

    def accepts(self, entry: CachedResponse, now: float) -> bool:
        if not matches(self.selector(), entry, now):
            return False
        if self.q:
            question = entry.meta.get("question")
            return isinstance(question, str) and self.q.casefold() in question.casefold()
        return True


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def decode_cursor(cursor: str) -> str:
    try:
        return base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("cursor: not a cursor returned by this API") from None


def summary(key: str, entry: CachedResponse, tiers: list[str], size: int, now: float) -> dict[str, Any]:
    meta = entry.meta
    return {"key": key, "tiers": tiers, "kind": entry.kind, "model": entry.model,
            "tenant": meta.get("tenant"), "namespace": meta.get("namespace"), "route": meta.get("route"),
            "question": meta.get("question"), "documents": list(meta.get("documents") or []),
            "created": entry.created, "age_s": round(entry.age(now), 3), "cost_s": entry.cost, "bytes": size}


def decoded_body(entry: CachedResponse) -> Any:
    try:
        return orjson.loads(entry.body)
    except orjson.JSONDecodeError:
        return entry.body.decode(errors="replace")


async def _candidates(tier: ResponseTier, query: EntryQuery) -> set[str]:
    found: set[str] | None = None
    for group in candidate_tags(query.selector()):
        keys: set[str] = set()
        for tag in group:
            keys.update(await tier.store.keys_with_tag(tag))
        found = keys if found is None else found & keys
    return found if found is not None else set(await tier.store.keys_with_tag(ALL_TAG))


async def list_entries(tiers: list[ResponseTier], query: EntryQuery, *, limit: int, cursor: str | None,
                       now: float | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """One page of matching entries and the cursor of the next page (``None`` at the end)."""
    now = time.time() if now is None else now
    chosen = [t for t in tiers if query.tier is None or t.name == query.tier]
    holders: dict[str, list[ResponseTier]] = {}
    for tier in chosen:
        for key in await _candidates(tier, query):
            holders.setdefault(key, []).append(tier)
    after = decode_cursor(cursor) if cursor else None
    page: list[dict[str, Any]] = []
    scanned = 0
    for key in sorted(holders):
        if after is not None and key <= after:
            continue
        scanned += 1
        if scanned % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        found = await read_entry(holders[key], key)
        if found is None:
            continue
        entry, size, present = found
        if not query.accepts(entry, now):
            continue
        if len(page) == limit:
            return page, encode_cursor(page[-1]["key"])
        page.append(summary(key, entry, present, size, now))
    return page, None


async def read_entry(tiers: list[ResponseTier], key: str) -> tuple[CachedResponse, int, list[str]] | None:
    """The entry under ``key`` from the first tier holding it, its size, and every tier holding it."""
    first: tuple[CachedResponse, int] | None = None
    present: list[str] = []
    for tier in tiers:
        raw = await tier.store.get(key)
        if raw is None:
            continue
        try:
            entry = CachedResponse.decode(raw)
        except CorruptEntry:
            continue
        present.append(tier.name)
        if first is None:
            first = (entry, len(raw))
    return None if first is None else (first[0], first[1], present)
