"""Qdrant search requests in canonical form: the query vector apart from everything else.

The retrieval cache may reuse a cached search for a new one only when *everything but the query vector* is the
same. :func:`parse_search` turns the REST body of one of

- ``POST /collections/{c}/points/search`` and ``/points/search/batch``,
- ``POST /collections/{c}/points/query`` and ``/points/query/batch``,
- ``POST /collections/{c}/points/recommend`` and ``/points/recommend/batch``

into a :class:`SearchRequest`: one :class:`SearchItem` per search (a plain request is a batch of one), each
carrying

- ``vector``: the dense query vector as float32 when the item is *approximable* (a plain dense vector:
  ``vector`` of a search as a list or ``{"name": ..., "vector": [...]}``, ``query`` of a query as a list or
  ``{"nearest": [...]}`` without ``mmr``), else ``None``;
- ``params_hash``: a digest of the canonical JSON of everything else — endpoint kind, collection, the URL
  query string (``consistency``, ``timeout``...), the vector name, filter, limit, offset, score_threshold,
  with_payload, with_vector, params, lookup_from, prefetch, shard_key, and for non-approximable items the
  query itself;
- ``exact_key``: ``params_hash`` plus the float32 bytes of the vector, so an exact vector repeat is found by
  hash.

Canonical form (``normalizer.canonical_json``): sorted keys, canonical numbers, top-level ``null`` fields
dropped (Qdrant treats an explicit ``null`` like an absent field). Nothing else is defaulted: ``limit`` absent
and ``limit: 10`` hash differently, which costs a miss, never a wrong hit.

Never guess: a body that is not a JSON object, an unknown top-level field, a vector that is not a list of
finite numbers, a random ``sample`` query, an unknown query object — anything not understood makes the whole
request uncacheable (``parse_search`` returns ``None``). Known but non-dense shapes (sparse or multi vectors,
a point id, recommend/discover/context/fusion/formula/order_by queries, recommend requests) are cacheable by
exact key only.

Each item also states what its result depends on beyond the vector index, for invalidation: ``rank_sensitive``
(a point deleted anywhere may change it: offset pages, prefetch pools, anything not a plain vector search) and
``payload_sensitive`` (a payload change on any point may change it: filters, prefetch, non-plain queries).
``collections`` lists every collection the item reads (its own plus ``lookup_from``).

:func:`vector_metrics` reads the distance of each vector of a collection from the body of ``GET
/collections/{c}``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from normalizer.canonical_json import CanonicalizationError, canonical_bytes

FloatVector = npt.NDArray[np.float32]
DEFAULT_VECTOR = ""
"""The name under which the unnamed (default) vector of a collection is known."""


class Distance(StrEnum):
    """A collection's vector metric, spelled as Qdrant spells it."""

    COSINE = "Cosine"
    DOT = "Dot"
    EUCLID = "Euclid"
    MANHATTAN = "Manhattan"


class SearchEndpoint(StrEnum):
    """The kind of search endpoint; batch endpoints answer a list with one result per item."""

    SEARCH = "search"
    QUERY = "query"
    RECOMMEND = "recommend"


@dataclass(frozen=True, slots=True)
class SearchItem:
    """One search of a request (see the module docstring for the fields' meaning)."""

    params_hash: str
    exact_key: str
    vector_name: str
    vector: FloatVector | None
    collections: frozenset[str]
    rank_sensitive: bool
    payload_sensitive: bool

    @property
    def approximable(self) -> bool:
        return self.vector is not None


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A parsed search request: one item per search, in request order."""

    collection: str
    endpoint: SearchEndpoint
    batch: bool
    items: tuple[SearchItem, ...]


_PATH = re.compile(r"^/collections/(?P<collection>[^/]+)/points/(?P<kind>search|query|recommend)(?P<batch>/batch)?/?$")

_SEARCH_FIELDS = frozenset(
    {
        "vector",
        "filter",
        "params",
        "limit",
        "offset",
        "with_payload",
        "with_vector",
        "score_threshold",
        "shard_key",
    }
)
_QUERY_FIELDS = frozenset(
    {
        "prefetch",
        "query",
        "using",
        "filter",
        "params",
        "score_threshold",
        "limit",
        "offset",
        "with_vector",
        "with_payload",
        "lookup_from",
        "shard_key",
    }
)
_RECOMMEND_FIELDS = frozenset(
    {
        "positive",
        "negative",
        "strategy",
        "filter",
        "params",
        "limit",
        "offset",
        "with_payload",
        "with_vector",
        "score_threshold",
        "using",
        "lookup_from",
        "shard_key",
    }
)
_PREFETCH_FIELDS = frozenset(
    {"prefetch", "query", "using", "filter", "params", "score_threshold", "limit", "lookup_from"}
)
_FIELDS = {
    SearchEndpoint.SEARCH: _SEARCH_FIELDS,
    SearchEndpoint.QUERY: _QUERY_FIELDS,
    SearchEndpoint.RECOMMEND: _RECOMMEND_FIELDS,
}
# Query objects understood as deterministic (exact-key cacheable); ``sample`` is random and never cacheable.
_QUERY_OBJECT_KEYS = frozenset(
    {
        "nearest",
        "recommend",
        "discover",
        "context",
        "order_by",
        "fusion",
        "rrf",
        "formula",
        "relevance_feedback",
    }
)
_QUERY_MODIFIER_KEYS = frozenset({"mmr", "defaults"})
_INFERENCE_KEYS = (
    frozenset({"text", "model"}),
    frozenset({"image", "model"}),
    frozenset({"object", "model"}),
)
_INFERENCE_OPTIONAL = frozenset({"options", "bm25"})


class Unsupported(ValueError):
    """A shape this module does not understand; the request must bypass the cache."""


def route(path: str) -> tuple[str, SearchEndpoint, bool] | None:
    """``(collection, endpoint, batch)`` for a cacheable search path, else ``None``."""
    match = _PATH.match(path)
    if match is None:
        return None
    return match["collection"], SearchEndpoint(match["kind"]), match["batch"] is not None


def parse_search(
    path: str, body: bytes | Mapping[str, Any], query_params: Mapping[str, str] | None = None
) -> SearchRequest | None:
    """The canonical form of a search request, or ``None`` when it must not be cached (module docs)."""
    routed = route(path)
    if routed is None:
        return None
    collection, endpoint, batch = routed
    try:
        document = orjson.loads(body) if isinstance(body, bytes | bytearray) else body
        if not isinstance(document, Mapping):
            return None
        url = {str(k): str(v) for k, v in sorted((query_params or {}).items())}
        if batch:
            if set(document) != {"searches"} or not isinstance(document["searches"], list):
                return None
            bodies = document["searches"]
        else:
            bodies = [document]
        items = tuple(_parse_item(collection, endpoint, url, item) for item in bodies)
    except (Unsupported, CanonicalizationError, orjson.JSONDecodeError):
        return None
    return SearchRequest(collection=collection, endpoint=endpoint, batch=batch, items=items)


# Qdrant's documented defaults: a field given with its default value is the same request as one without it
# (qdrant-client sends ``with_vector: false`` explicitly, raw REST callers usually omit it).
_DEFAULTS: Mapping[str, object] = {"with_vector": False, "with_payload": False, "offset": 0, "limit": 10}


def _is_default(key: str, value: object) -> bool:
    default = _DEFAULTS.get(key, _DEFAULTS)
    return type(value) is type(default) and value == default


def _parse_item(collection: str, endpoint: SearchEndpoint, url: dict[str, str], raw: object) -> SearchItem:
    if not isinstance(raw, Mapping):
        raise Unsupported("a search must be a JSON object")
    body = {str(k): v for k, v in raw.items() if v is not None and not _is_default(str(k), v)}
    unknown = set(body) - _FIELDS[endpoint]
    if unknown:
        raise Unsupported(f"unknown fields {sorted(unknown)}")
    _check_offset_limit(body)
    if endpoint is SearchEndpoint.SEARCH:
        name, vector, rest = _split_search_vector(body)
        plain = vector is not None
    elif endpoint is SearchEndpoint.QUERY:
        name, vector, rest = _split_query_vector(body)
        plain = vector is not None
    else:
        name, vector, rest = str(body.get("using", DEFAULT_VECTOR)), None, body
        plain = False
    has_prefetch = "prefetch" in body
    identity = {
        "endpoint": endpoint.value,
        "collection": collection,
        "url": url,
        "vector_name": name,
        "body": rest,
    }
    params_hash = _digest(canonical_bytes(identity))
    vector_bytes = vector.tobytes() if vector is not None else b""
    return SearchItem(
        params_hash=params_hash,
        exact_key=_digest(params_hash.encode() + b"\x00" + vector_bytes),
        vector_name=name,
        vector=vector,
        collections=frozenset({collection, *_lookup_collections(body)}),
        rank_sensitive=not plain or has_prefetch or int(body.get("offset", 0)) > 0,
        payload_sensitive=not plain or has_prefetch or "filter" in body,
    )


def _check_offset_limit(body: Mapping[str, Any]) -> None:
    for key in ("limit", "offset"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise Unsupported(f"{key} must be a non-negative integer")


def _split_search_vector(body: dict[str, Any]) -> tuple[str, FloatVector | None, dict[str, Any]]:
    """``/points/search``: ``vector`` is a list, ``{"name", "vector": list}`` or a named sparse vector."""
    if "vector" not in body:
        raise Unsupported("a search needs a vector")
    raw = body["vector"]
    rest = {k: v for k, v in body.items() if k != "vector"}
    if isinstance(raw, list):
        return DEFAULT_VECTOR, dense_vector(raw), rest
    if isinstance(raw, Mapping) and set(raw) == {"name", "vector"} and isinstance(raw["name"], str):
        inner = raw["vector"]
        if isinstance(inner, list):
            return raw["name"], dense_vector(inner), rest
        if _is_sparse(inner):
            return raw["name"], None, {**rest, "sparse_vector": inner}
    raise Unsupported("unknown search vector shape")


def _split_query_vector(body: dict[str, Any]) -> tuple[str, FloatVector | None, dict[str, Any]]:
    """``/points/query``: a dense ``query`` (or ``{"nearest": dense}``) is approximable; others exact."""
    name = body.get("using", DEFAULT_VECTOR)
    if not isinstance(name, str):
        raise Unsupported("using must be a string")
    if "prefetch" in body:
        _check_prefetch(body["prefetch"])
    query = body.get("query")
    rest = {k: v for k, v in body.items() if k not in ("query", "using")}
    dense = query.get("nearest") if isinstance(query, Mapping) and set(query) == {"nearest"} else query
    if isinstance(dense, list) and dense and type(dense[0]) in _NUMBER_TYPES:  # dense_vector checks the rest
        return name, dense_vector(dense), rest
    if query is not None:
        _check_query(query)
    return name, None, {**rest, "query": query}


def _check_prefetch(prefetch: object) -> None:
    for item in prefetch if isinstance(prefetch, list) else [prefetch]:
        if not isinstance(item, Mapping) or set(item) - _PREFETCH_FIELDS:
            raise Unsupported("unknown prefetch shape")
        if item.get("query") is not None:
            _check_query(item["query"])
        if item.get("prefetch") is not None:
            _check_prefetch(item["prefetch"])


def _check_query(query: object) -> None:
    """Accept the deterministic query shapes Qdrant documents; refuse ``sample`` and anything unknown."""
    if isinstance(query, bool):
        raise Unsupported("a boolean is not a query")
    if isinstance(query, int | str):  # a point id
        return
    if isinstance(query, list):
        if _is_flat_number_list(query):
            return
        if query and all(isinstance(row, list) and _is_flat_number_list(row) for row in query):
            return
        raise Unsupported("unknown list query")
    if isinstance(query, Mapping):
        keys = set(query)
        if _is_sparse(query):
            return
        if any(keys >= need and not keys - need - _INFERENCE_OPTIONAL for need in _INFERENCE_KEYS):
            return
        main = keys - _QUERY_MODIFIER_KEYS
        if len(main) == 1 and main <= _QUERY_OBJECT_KEYS:
            return
    raise Unsupported("unknown query shape")


def _lookup_collections(body: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()
    lookup = body.get("lookup_from")
    if isinstance(lookup, Mapping) and isinstance(lookup.get("collection"), str):
        found.add(lookup["collection"])
    prefetch = body.get("prefetch")
    for item in prefetch if isinstance(prefetch, list) else [prefetch] if prefetch else []:
        if isinstance(item, Mapping):
            found |= _lookup_collections(item)
    return found


_NUMBER_TYPES = frozenset({int, float})
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_flat_number_list(values: list[Any]) -> bool:
    """Non-empty and only JSON numbers (``bool`` is its own type, so ``True`` is refused); C-speed type scan."""
    return bool(values) and set(map(type, values)) <= _NUMBER_TYPES


def _is_sparse(value: object) -> bool:
    return isinstance(value, Mapping) and set(value) == {"indices", "values"}


def dense_vector(values: list[Any]) -> FloatVector:
    """A JSON list of finite numbers as float32 (Qdrant's own precision); :class:`Unsupported` otherwise."""
    if not _is_flat_number_list(values):
        raise Unsupported("a dense vector is a non-empty list of numbers")
    try:
        wide = np.asarray(values, dtype=np.float64)
    except OverflowError as exc:  # an integer beyond float range
        raise Unsupported("vector overflows float32") from exc
    if not np.abs(wide).max() <= _FLOAT32_MAX:  # also refuses NaN/inf (never from JSON)
        raise Unsupported("vector overflows float32")
    return wide.astype(np.float32)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def vector_metrics(collection_info: bytes | Mapping[str, Any]) -> dict[str, Distance]:
    """Vector name → distance from a ``GET /collections/{c}`` body (unnamed vector: :data:`DEFAULT_VECTOR`).

    Unknown shapes give ``{}`` (the cache then serves exact repeats only for that collection).
    """
    try:
        document = orjson.loads(collection_info) if isinstance(collection_info, bytes) else collection_info
        vectors = document["result"]["config"]["params"]["vectors"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return {}
    if not isinstance(vectors, Mapping):
        return {}
    if "distance" in vectors:
        return _metric_of(DEFAULT_VECTOR, vectors)
    metrics: dict[str, Distance] = {}
    for name, params in vectors.items():
        if isinstance(params, Mapping):
            metrics.update(_metric_of(str(name), params))
    return metrics


def _metric_of(name: str, params: Mapping[str, Any]) -> dict[str, Distance]:
    if params.get("multivector_config") is not None:  # multi-vectors are compared by exact key only
        return {}
    try:
        return {name: Distance(params["distance"])}
    except (KeyError, ValueError):
        return {}
