"""What a Qdrant write does to cached searches: the pure classification of a request that passed the proxy.

:func:`write_effects` maps ``(method, path, body)`` to the :class:`WriteEffect` s it has (none for reads). The
rules are conservative — when in doubt, the whole collection goes:

- ``COLLECTION`` (every cached search reading the collection is dropped): collection
  create/recreate/drop/update, upserts and vector updates (a new or moved vector may enter any result),
  ``points/batch``, field-index, snapshot and shard operations, any unknown non-read request, and every point
  operation selected by a filter (its ids unknown);
- ``POINTS_REMOVED`` (ids known): ``points/delete`` and ``points/vectors/delete`` by id — drops the searches
  whose result contained one of the ids, plus every search that is rank-sensitive (an offset page, a prefetch
  pool, a non-plain query) or whose ids were not tracked;
- ``PAYLOAD_CHANGED`` (ids known): set/overwrite/delete/clear payload by id — drops the searches whose result
  contained one of the ids, plus every payload-sensitive one (a filter, a prefetch, a non-plain query);
- alias changes (``POST /collections/aliases``): ``COLLECTION`` for each alias name an action names (that name may
  now mean another collection, or none); ``ALL`` when the actions cannot be read. Only the searches made through
  those names go: through the proxy, alias names are the tenant's own (:mod:`proxy.search.tenancy`), so one
  tenant's alias changes never drop another tenant's cached searches;
- ``ALL``: any other non-read request outside ``/collections/{c}``.

Point ids are canonical: integers stay integers, UUID strings become lowercase hyphenated (as Qdrant answers
them).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

PointId = int | str


class WriteScope(StrEnum):
    COLLECTION = "collection"
    POINTS_REMOVED = "points_removed"
    PAYLOAD_CHANGED = "payload_changed"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class WriteEffect:
    """What to drop: a scope, its collection (empty for ``ALL``) and, for point scopes, the touched ids."""

    scope: WriteScope
    collection: str = ""
    point_ids: frozenset[PointId] = frozenset()


_READ_SUFFIXES = re.compile(
    r"^/collections/[^/]+/(points(/(search|query|recommend|discover)(/(batch|groups|matrix/pairs|matrix/offsets))?"
    r"|/scroll|/count)?|facet)/?$"
)
_COLLECTION = re.compile(r"^/collections/(?P<collection>[^/]+)(?P<rest>/.*)?$")
_PAYLOAD_PATHS = frozenset({"/points/payload", "/points/payload/delete", "/points/payload/clear"})
_REMOVAL_PATHS = frozenset({"/points/delete", "/points/vectors/delete"})


def canonical_point_id(value: object) -> PointId | None:
    """An id as Qdrant reports it, or ``None`` when ``value`` is not a point id."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            return None
    return None


def point_ids(values: Iterable[object]) -> frozenset[PointId] | None:
    """Canonical ids, or ``None`` if any value is not an id."""
    found: set[PointId] = set()
    for value in values:
        canonical = canonical_point_id(value)
        if canonical is None:
            return None
        found.add(canonical)
    return frozenset(found)


def write_effects(method: str, path: str, body: bytes | Mapping[str, Any] | None) -> tuple[WriteEffect, ...]:
    """The effects of a request on cached searches (``path`` decoded); none when it only reads."""
    method = method.upper()
    path = path.split("?", 1)[0]
    if method in ("GET", "HEAD", "OPTIONS"):
        return ()
    if path.rstrip("/") == "/collections/aliases":
        names = _alias_names(body)
        return (WriteEffect(WriteScope.ALL),) if names is None else tuple(
            WriteEffect(WriteScope.COLLECTION, name) for name in names)
    match = _COLLECTION.match(path)
    if match is None:
        return () if method == "POST" and path.rstrip("/") == "/collections" else (WriteEffect(WriteScope.ALL),)
    collection, rest = match["collection"], (match["rest"] or "").rstrip("/")
    if method == "POST" and (_READ_SUFFIXES.match(path) or rest == "/points"):  # POST /points = retrieve by ids
        return ()
    whole = WriteEffect(WriteScope.COLLECTION, collection)
    if rest in _REMOVAL_PATHS and method == "POST":
        scope = WriteScope.POINTS_REMOVED
    elif rest in _PAYLOAD_PATHS and method in ("POST", "PUT"):
        scope = WriteScope.PAYLOAD_CHANGED
    else:
        return (whole,)
    ids = _selected_ids(body)
    return (whole if ids is None else WriteEffect(scope, collection, ids),)


_ALIAS_FIELDS = ("alias_name", "old_alias_name", "new_alias_name")


def _alias_names(body: bytes | Mapping[str, Any] | None) -> list[str] | None:
    """Every alias name the actions of an alias change name, or ``None`` when they cannot be read."""
    try:
        document = orjson.loads(body) if isinstance(body, bytes | bytearray) else body
    except orjson.JSONDecodeError:
        return None
    actions = document.get("actions") if isinstance(document, Mapping) else None
    if not isinstance(actions, list):
        return None
    names: list[str] = []
    for action in actions:
        specs = list(action.values()) if isinstance(action, Mapping) else None
        if not specs or not all(isinstance(spec, Mapping) for spec in specs):
            return None
        names += [spec[field] for spec in specs for field in _ALIAS_FIELDS if isinstance(spec.get(field), str)]
    return names


def _selected_ids(body: bytes | Mapping[str, Any] | None) -> frozenset[PointId] | None:
    """The ids a point operation names, or ``None`` when it selects by filter (or cannot be read)."""
    try:
        document = orjson.loads(body) if isinstance(body, bytes | bytearray) else body
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, Mapping) or document.get("filter") is not None:
        return None
    selected = document.get("points")
    if not isinstance(selected, list):
        return None
    return point_ids(selected)
