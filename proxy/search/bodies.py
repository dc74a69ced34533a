"""The body sent to Qdrant: the client's, with every collection it names mapped to its upstream name. Pure.

Each row of :data:`proxy.search.routes.ROUTES` says where its body names collections (:class:`~proxy.search.routes.
Body`) and which fields it may carry. A field the row does not list is refused (400), at the top of the body and at
every level that can name a collection — each search of a batch, each ``prefetch``, ``lookup_from``,
``with_lookup``, ``init_from``, each alias action — so that a field a newer Qdrant adds, which could name a
collection, is never forwarded unmapped. Where names are:

* ``lookup_from.collection``: queries, recommend and discover requests, each ``prefetch`` (nested up to
  ``limits.prefetch_depth``, Qdrant's own limit), each search of a batch — read access;
* ``with_lookup`` (a name, or an object with ``collection``): the ``groups`` searches — read access;
* ``init_from.collection``: creating a collection (older Qdrant servers copy its points) — read access;
* alias actions (``create_alias``, ``delete_alias``, ``rename_alias``): every alias name and the collection — the
  right to manage both, so a tenant aliases only its own collections (an alias of a shared collection would give
  it every right there).

Points, payloads, filters and vectors name no collection and are forwarded as parsed; a ``shard_key`` selects shards
of the collection the request names (or of ``lookup_from``'s), never another collection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.core.errors import ProxyError
from proxy.search.routes import (
    ALIAS_ACTIONS,
    LOOKUP_FIELDS,
    PREFETCH_FIELDS,
    WITH_LOOKUP_FIELDS,
    Access,
    Body,
    Route,
    collection_name,
)
from proxy.search.tenancy import TenantView


def _bad(message: str) -> ProxyError:
    return ProxyError(400, f"Bad request: {message}", code="bad_request")


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(f"{what} must be a JSON object")
    return value


def _known(value: Mapping[str, Any], fields: frozenset[str], what: str) -> None:
    unknown = [str(name) for name in value if name not in fields]
    if unknown:
        raise _bad(f"unknown field {unknown[0]!r} in {what} (this proxy forwards {', '.join(sorted(fields))})")


class BodyMapper:
    """Maps request bodies for one tenant's view (:class:`~proxy.search.tenancy.TenantView`)."""

    def __init__(self, view: TenantView, prefetch_depth: int) -> None:
        self.view = view
        self.prefetch_depth = prefetch_depth

    def upstream_body(self, route: Route, body: object) -> dict[str, Any]:
        """The body ``route`` sends upstream for the client's parsed ``body`` (a new object; 400/403 when it holds
        a field the row does not forward or names a collection the tenant may not use so)."""
        document = _object(body, "the request body")
        if route.body is Body.SEARCH_BATCH:
            _known(document, frozenset({"searches"}), "the request body")
            searches = document.get("searches")
            if not isinstance(searches, list):
                raise _bad("searches must be a list")
            return {**document, "searches": [self._search(item, route.fields, "each search", 1)
                                             for item in searches]}
        _known(document, route.fields, "the request body")
        if route.body in (Body.SEARCH, Body.GROUPS):
            return self._search(document, route.fields, "the request body", 1)
        if route.body is Body.CREATE and document.get("init_from") is not None:
            source = _object(document["init_from"], "init_from")
            _known(source, frozenset({"collection"}), "init_from")
            return {**document, "init_from": {"collection": self._name(source.get("collection"), Access.READ)}}
        if route.body is Body.ALIASES:
            return {**document, "actions": self._alias_actions(document.get("actions"))}
        return dict(document)

    def _name(self, value: object, need: Access, what: str = "collection name") -> str:
        return self.view.upstream(collection_name(value, what), need)

    def _search(self, value: object, fields: frozenset[str], what: str, depth: int) -> dict[str, Any]:
        search = _object(value, what)
        _known(search, fields, what)
        mapped = dict(search)
        lookup = search.get("lookup_from")
        if lookup is not None:
            location = _object(lookup, "lookup_from")
            _known(location, LOOKUP_FIELDS, "lookup_from")
            mapped["lookup_from"] = {**location, "collection": self._name(location.get("collection"), Access.READ)}
        prefetch = search.get("prefetch")
        if prefetch is not None:
            if depth > self.prefetch_depth:
                raise _bad(f"prefetch nests deeper than {self.prefetch_depth}")
            mapped["prefetch"] = ([self._search(item, PREFETCH_FIELDS, "prefetch", depth + 1) for item in prefetch]
                                  if isinstance(prefetch, list) else
                                  self._search(prefetch, PREFETCH_FIELDS, "prefetch", depth + 1))
        joined = search.get("with_lookup")
        if joined is not None:
            if isinstance(joined, str):
                mapped["with_lookup"] = self._name(joined, Access.READ)
            else:
                location = _object(joined, "with_lookup")
                _known(location, WITH_LOOKUP_FIELDS, "with_lookup")
                mapped["with_lookup"] = {**location, "collection": self._name(location.get("collection"),
                                                                              Access.READ)}
        return mapped

    def _alias_actions(self, actions: object) -> list[dict[str, Any]]:
        if not isinstance(actions, list):
            raise _bad("actions must be a list")
        mapped: list[dict[str, Any]] = []
        for raw in actions:
            action = _object(raw, "each alias action")
            _known(action, frozenset(ALIAS_ACTIONS), "an alias action")
            if len(action) != 1:
                raise _bad("an alias action names exactly one of " + ", ".join(ALIAS_ACTIONS))
            (kind, names), = action.items()
            spec = _object(names, kind)
            _known(spec, frozenset(ALIAS_ACTIONS[kind]), kind)
            mapped.append({kind: {field: self._name(spec.get(field), Access.MANAGE, field.replace("_", " "))
                                  for field in ALIAS_ACTIONS[kind]}})
        return mapped
