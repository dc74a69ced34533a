"""The Qdrant requests the proxy serves: one row per route, and the upstream request built from a row.

Deny by construction: the proxy sends Qdrant only what a row of :data:`ROUTES` produces. A row names its method,
an exact path template whose ``{parameters}`` are typed (a collection name, a point id, a payload field, a vector
name), the query parameters it takes (each typed), the right it needs on the collection it names, how its body
names collections, whether its answer lists names, and which pipeline runs it. :func:`match` reads a request
against the table; :meth:`QdrantCall.upstream_path` rebuilds the path and query from the typed values (the
collection replaced by its upstream name, :mod:`proxy.search.tenancy`), so the client's path never reaches Qdrant.
A request no row matches is refused: 403 where the route is known and kept from tenants (:data:`KEPT_FROM_TENANTS`,
with the reason), 404 otherwise, both in Qdrant's error shape.

The rows are Qdrant's REST API as qdrant-client's ``http/api`` modules call it, plus the search, recommend and
discover routes that Qdrant still serves and older clients send. What is left out, and why:

* snapshots (``/snapshots``, ``/collections/{c}/snapshots``, shard snapshots): files on the Qdrant host, named
  after the upstream collection; a full snapshot holds every tenant, a recovery from a URL makes Qdrant fetch any
  address, an upload replaces a collection wholesale;
* the cluster (``/cluster``, ``/collections/{c}/cluster``, shard keys, shards): peers, their addresses and shard
  placement are the operator's;
* ``/telemetry``, ``/metrics``, ``/issues``, ``/locks``, ``/quotas``: server-wide, they name or act on every
  tenant's collections;
* ``/collections/{c}/optimizations``: the operator's view of a collection's segments;
* ``/healthz``, ``/livez``, ``/readyz``: the proxy answers ``/healthz`` and ``/readyz`` itself.
"""

from __future__ import annotations

import operator
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from urllib.parse import quote, urlencode

from proxy.core.errors import ProxyError


class Access(IntEnum):
    """The right a request needs on the collection it names (each includes the ones before)."""

    READ = 1
    """Searches, scroll, count, retrieval, the collection's description."""
    WRITE = 2
    """Points and payloads changed."""
    MANAGE = 3
    """The collection itself: created, changed, deleted, its indexes, vectors and aliases."""


class Kind(Enum):
    """The pipeline a row's requests run through."""

    SEARCH = "search"
    """A search the search cache may answer (:mod:`proxy.search.stages`)."""
    WRITE = "write"
    """A change that drops the cached searches it could affect."""
    READ = "read"
    """Anything else: forwarded and billed per request."""


class Body(Enum):
    """Where a row's JSON body names collections (:mod:`proxy.search.bodies` maps each)."""

    NONE = "none"
    """No body: a request that sends one is refused."""
    PLAIN = "plain"
    """An object that names no collection."""
    SEARCH = "search"
    """``lookup_from`` (and in each ``prefetch``)."""
    SEARCH_BATCH = "search_batch"
    """``searches``, each a :attr:`SEARCH`."""
    GROUPS = "groups"
    """A :attr:`SEARCH` with ``with_lookup``."""
    CREATE = "create"
    """``init_from`` (older Qdrant servers copy a collection's points from it)."""
    ALIASES = "aliases"
    """Alias actions: both names of each."""


class Listing(Enum):
    """Whether a row's answer lists collection names (filtered and mapped back, :mod:`proxy.search.answers`)."""

    NONE = "none"
    COLLECTIONS = "collections"
    ALIASES = "aliases"


# -- typed values -------------------------------------------------------------------------------------------------

MAX_NAME_CHARS = 255
"""Qdrant's longest collection name."""
_NOT_IN_NAMES = re.compile(r'[<>:"/\\|?*%;\x00-\x1f\x7f-\x9f\ufffd]')
"""Qdrant refuses ``< > : " / \\ | ? *`` and NUL; ``%`` and ``;`` (read differently by servers on the way),
control characters and U+FFFD (what invalid UTF-8 decodes to) are refused here too."""


def _bad(message: str) -> ProxyError:
    return ProxyError(400, f"Bad request: {message}", code="bad_request")


def collection_name(value: object, what: str = "collection name") -> str:
    """A collection (or alias) name as a client may give it, or 400."""
    if not isinstance(value, str):
        raise _bad(f"the {what} must be a string")
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise _bad(f"the {what} must have 1 to {MAX_NAME_CHARS} characters")
    bad = _NOT_IN_NAMES.search(value)
    if bad is not None or value in (".", ".."):
        raise _bad(f"the {what} {value!r} holds a character Qdrant or this proxy refuses in names")
    return value


def point_id(value: str) -> str:
    """A point id as Qdrant reads it: an unsigned 64-bit integer or a UUID (rebuilt in canonical form)."""
    if value.isascii() and value.isdigit():
        number = int(value)
        if number < 2**64:
            return str(number)
    else:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    raise _bad(f"{value!r} is not a point id (an unsigned integer or a UUID)")


_FIELD = re.compile(r"[^\x00-\x1f\x7f-\x9f/\\?#%;\ufffd]{1,256}")


def field_name(value: str) -> str:
    """A payload field (a key path such as ``meta.source``) or a vector name, as a path segment."""
    if _FIELD.fullmatch(value) is None:
        raise _bad(f"{value!r} is not a field or vector name this proxy forwards")
    return value


_PARAMETERS: Mapping[str, Callable[[str], str]] = {
    "collection": collection_name, "id": point_id, "field_name": field_name, "vector_name": field_name}
"""The type of each path parameter, by its name in the templates."""


def _flag(value: str) -> str:
    if value not in ("true", "false"):
        raise _bad(f"expected true or false, got {value!r}")
    return value


def _count(value: str) -> str:
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise _bad(f"expected a non-negative integer, got {value!r}")
    return str(int(value))


def _one_of(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise _bad(f"expected one of {', '.join(allowed)}, got {value!r}")
        return value

    return parse


def _consistency(value: str) -> str:
    return value if value in ("majority", "quorum", "all") else _count(value)


QUERY_PARAMETERS: Mapping[str, Callable[[str], str]] = {
    "wait": _flag, "ordering": _one_of("weak", "medium", "strong"), "timeout": _count, "consistency": _consistency}
"""The type of each query parameter a row may take."""

_WRITES = ("wait", "ordering", "timeout")
_READS = ("consistency", "timeout")
_TIMEOUT = ("timeout",)


# -- the table ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Route:
    """One Qdrant request the proxy serves (see the module docstring)."""

    method: str
    template: str
    kind: Kind
    access: Access | None
    """The right needed on the ``{collection}`` of the path (``None``: the path names none)."""
    body: Body = Body.NONE
    fields: frozenset[str] = frozenset()
    """The body's fields that are forwarded (of each search of a batch); any other is refused."""
    query: tuple[str, ...] = ()
    listing: Listing = Listing.NONE
    segments: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.template.split("/")[1:]))

    @property
    def example(self) -> str:
        """A path this row serves (each parameter given a plain value)."""
        samples = {"collection": "docs", "id": "1", "field_name": "year", "vector_name": "image"}
        path = self.template
        for name, value in samples.items():
            path = path.replace("{" + name + "}", value)
        return path


def _fields(*names: str) -> frozenset[str]:
    return frozenset(names)


# The body fields of each request, as in qdrant-client's models (tests/proxy/test_qdrant_routes.py holds them equal
# to the installed client's), plus those Qdrant still reads from older clients (``init_from``; the search,
# recommend and discover requests, whose models qdrant-client no longer ships).
CREATE_FIELDS = _fields("vectors", "shard_number", "sharding_method", "replication_factor", "write_consistency_factor",
                        "on_disk_payload", "payload", "id_tracker", "hnsw_config", "wal_config", "optimizers_config",
                        "quantization_config", "sparse_vectors", "strict_mode_config", "metadata", "init_from")
UPDATE_FIELDS = _fields("vectors", "optimizers_config", "params", "hnsw_config", "quantization_config",
                        "sparse_vectors", "strict_mode_config", "metadata")
VECTOR_NAME_FIELDS = _fields("dense", "sparse")
INDEX_FIELDS = _fields("field_name", "field_schema")
UPSERT_FIELDS = _fields("points", "batch", "shard_key", "update_filter", "update_mode")
RETRIEVE_FIELDS = _fields("ids", "shard_key", "with_payload", "with_vector")
SELECTOR_FIELDS = _fields("points", "filter", "shard_key")
VECTORS_FIELDS = _fields("points", "shard_key", "update_filter")
DELETE_VECTORS_FIELDS = _fields("points", "filter", "shard_key", "vector")
SET_PAYLOAD_FIELDS = _fields("payload", "points", "filter", "shard_key", "key")
DELETE_PAYLOAD_FIELDS = _fields("keys", "points", "filter", "shard_key")
BATCH_UPDATE_FIELDS = _fields("operations")
SCROLL_FIELDS = _fields("shard_key", "offset", "limit", "filter", "with_payload", "with_vector", "order_by")
COUNT_FIELDS = _fields("shard_key", "filter", "exact")
FACET_FIELDS = _fields("shard_key", "key", "limit", "filter", "exact")
QUERY_FIELDS = _fields("shard_key", "prefetch", "query", "using", "filter", "params", "score_threshold", "limit",
                       "offset", "with_vector", "with_payload", "lookup_from")
GROUP_FIELDS = _fields("group_by", "group_size", "with_lookup")
QUERY_GROUPS_FIELDS = (QUERY_FIELDS - {"offset"}) | GROUP_FIELDS
MATRIX_FIELDS = _fields("shard_key", "filter", "sample", "limit", "using")
SEARCH_FIELDS = _fields("shard_key", "vector", "filter", "params", "limit", "offset", "with_payload", "with_vector",
                        "score_threshold")
SEARCH_GROUPS_FIELDS = (SEARCH_FIELDS - {"offset"}) | GROUP_FIELDS
RECOMMEND_FIELDS = _fields("shard_key", "positive", "negative", "strategy", "filter", "params", "limit", "offset",
                           "with_payload", "with_vector", "score_threshold", "using", "lookup_from")
RECOMMEND_GROUPS_FIELDS = (RECOMMEND_FIELDS - {"offset"}) | GROUP_FIELDS
DISCOVER_FIELDS = _fields("shard_key", "target", "context", "filter", "params", "limit", "offset", "with_payload",
                          "with_vector", "using", "lookup_from")
PREFETCH_FIELDS = _fields("prefetch", "query", "using", "filter", "params", "score_threshold", "limit", "lookup_from")
LOOKUP_FIELDS = _fields("collection", "vector", "shard_key")
WITH_LOOKUP_FIELDS = _fields("collection", "with_payload", "with_vectors")
ALIAS_ACTIONS = {"create_alias": ("alias_name", "collection_name"), "delete_alias": ("alias_name",),
                 "rename_alias": ("old_alias_name", "new_alias_name")}
"""Each alias action and the names it carries."""

_C = "/collections/{collection}"
_P = _C + "/points"
R, W, M = Access.READ, Access.WRITE, Access.MANAGE


def _search(path: str, fields: frozenset[str], *, cached: bool = False, batch: bool = False,
            groups: bool = False) -> Route:
    body = Body.SEARCH_BATCH if batch else Body.GROUPS if groups else Body.SEARCH
    return Route("POST", path, Kind.SEARCH if cached else Kind.READ, R, body, fields, _READS)


ROUTES: tuple[Route, ...] = (
    Route("GET", "/", Kind.READ, None),
    Route("HEAD", "/", Kind.READ, None),
    Route("GET", "/collections", Kind.READ, None, listing=Listing.COLLECTIONS),
    Route("GET", "/aliases", Kind.READ, None, listing=Listing.ALIASES),
    Route("POST", "/collections/aliases", Kind.WRITE, None, Body.ALIASES, _fields("actions"), _TIMEOUT),
    Route("GET", _C, Kind.READ, R),
    Route("GET", _C + "/exists", Kind.READ, R),
    Route("GET", _C + "/aliases", Kind.READ, R, listing=Listing.ALIASES),
    Route("PUT", _C, Kind.WRITE, M, Body.CREATE, CREATE_FIELDS, _TIMEOUT),
    Route("PATCH", _C, Kind.WRITE, M, Body.PLAIN, UPDATE_FIELDS, _TIMEOUT),
    Route("DELETE", _C, Kind.WRITE, M, query=_TIMEOUT),
    Route("PUT", _C + "/index", Kind.WRITE, M, Body.PLAIN, INDEX_FIELDS, _WRITES),
    Route("DELETE", _C + "/index/{field_name}", Kind.WRITE, M, query=_WRITES),
    Route("PUT", _C + "/vectors/{vector_name}", Kind.WRITE, M, Body.PLAIN, VECTOR_NAME_FIELDS, _WRITES),
    Route("DELETE", _C + "/vectors/{vector_name}", Kind.WRITE, M, query=_WRITES),
    Route("PUT", _P, Kind.WRITE, W, Body.PLAIN, UPSERT_FIELDS, _WRITES),
    Route("POST", _P, Kind.READ, R, Body.PLAIN, RETRIEVE_FIELDS, _READS),
    Route("GET", _P + "/{id}", Kind.READ, R, query=_READS),
    Route("POST", _P + "/delete", Kind.WRITE, W, Body.PLAIN, SELECTOR_FIELDS, _WRITES),
    Route("PUT", _P + "/vectors", Kind.WRITE, W, Body.PLAIN, VECTORS_FIELDS, _WRITES),
    Route("POST", _P + "/vectors/delete", Kind.WRITE, W, Body.PLAIN, DELETE_VECTORS_FIELDS, _WRITES),
    Route("POST", _P + "/payload", Kind.WRITE, W, Body.PLAIN, SET_PAYLOAD_FIELDS, _WRITES),
    Route("PUT", _P + "/payload", Kind.WRITE, W, Body.PLAIN, SET_PAYLOAD_FIELDS, _WRITES),
    Route("POST", _P + "/payload/delete", Kind.WRITE, W, Body.PLAIN, DELETE_PAYLOAD_FIELDS, _WRITES),
    Route("POST", _P + "/payload/clear", Kind.WRITE, W, Body.PLAIN, SELECTOR_FIELDS, _WRITES),
    Route("POST", _P + "/batch", Kind.WRITE, W, Body.PLAIN, BATCH_UPDATE_FIELDS, _WRITES),
    Route("POST", _P + "/scroll", Kind.READ, R, Body.PLAIN, SCROLL_FIELDS, _READS),
    Route("POST", _P + "/count", Kind.READ, R, Body.PLAIN, COUNT_FIELDS, _READS),
    Route("POST", _C + "/facet", Kind.READ, R, Body.PLAIN, FACET_FIELDS, _READS),
    _search(_P + "/query", QUERY_FIELDS, cached=True),
    _search(_P + "/query/batch", QUERY_FIELDS, cached=True, batch=True),
    _search(_P + "/query/groups", QUERY_GROUPS_FIELDS, groups=True),
    _search(_P + "/search", SEARCH_FIELDS, cached=True),
    _search(_P + "/search/batch", SEARCH_FIELDS, cached=True, batch=True),
    _search(_P + "/search/groups", SEARCH_GROUPS_FIELDS, groups=True),
    _search(_P + "/recommend", RECOMMEND_FIELDS, cached=True),
    _search(_P + "/recommend/batch", RECOMMEND_FIELDS, cached=True, batch=True),
    _search(_P + "/recommend/groups", RECOMMEND_GROUPS_FIELDS, groups=True),
    _search(_P + "/discover", DISCOVER_FIELDS),
    _search(_P + "/discover/batch", DISCOVER_FIELDS, batch=True),
    Route("POST", _P + "/search/matrix/pairs", Kind.READ, R, Body.PLAIN, MATRIX_FIELDS, _READS),
    Route("POST", _P + "/search/matrix/offsets", Kind.READ, R, Body.PLAIN, MATRIX_FIELDS, _READS),
)
"""Every Qdrant request the proxy forwards."""

KEPT_FROM_TENANTS: Mapping[str, str] = {
    "snapshots": "snapshots are files on the Qdrant host that hold whole collections (a full one every tenant's)",
    "cluster": "the cluster's peers, shards and their placement are the operator's",
    "shards": "the cluster's peers, shards and their placement are the operator's",
    "telemetry": "server-wide statistics name every tenant's collections",
    "metrics": "server-wide statistics name every tenant's collections",
    "issues": "server-wide issues name every tenant's collections",
    "locks": "a lock stops writes to every tenant's collections",
    "quotas": "quotas are the operator's",
    "optimizations": "a collection's segments and optimizer runs are the operator's to watch",
}
"""Qdrant routes that exist but are not served to tenants, by their first segment (or their third, under
``/collections/{c}``), each with the reason (a 403)."""


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where the parameters of some templates of one method and segment count are: ``rows`` by their literal
    segments (read with ``literals``)."""

    parameters: tuple[int, ...]
    literals: Callable[[list[str]], tuple[str, ...]]
    rows: dict[tuple[str, ...], Route]


def _index(rows: tuple[Route, ...]) -> dict[tuple[str, int], list[_Shape]]:
    """Rows by method and segment count, then by where their parameters are (fewest first: a literal segment wins
    over a parameter, so ``POST /collections/aliases`` is the aliases' route), then by their literal segments."""
    grouped: dict[tuple[str, int], dict[tuple[int, ...], dict[tuple[str, ...], Route]]] = {}
    for row in rows:
        parameters = tuple(n for n, segment in enumerate(row.segments) if segment.startswith("{"))
        literals = tuple(segment for n, segment in enumerate(row.segments) if n not in parameters)
        grouped.setdefault((row.method, len(row.segments)), {}).setdefault(parameters, {})[literals] = row
    index: dict[tuple[str, int], list[_Shape]] = {}
    for (method, count), shapes in grouped.items():
        for parameters, by_literals in sorted(shapes.items(), key=lambda item: len(item[0])):
            positions = [n for n in range(count) if n not in parameters]
            index.setdefault((method, count), []).append(_Shape(parameters, _reader(positions), by_literals))
    return index


def _reader(positions: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    if len(positions) == 1:  # itemgetter of one position gives the item, not a tuple
        only = positions[0]
        return lambda segments: (segments[only],)
    return operator.itemgetter(*positions)


_INDEX = _index(ROUTES)


@dataclass(frozen=True, slots=True)
class QdrantCall:
    """A request read against its row: the typed path parameters, and the typed query (as it goes upstream)."""

    route: Route
    parameters: Mapping[str, str]
    query: tuple[tuple[str, str], ...] = ()

    @property
    def collection(self) -> str | None:
        """The collection (or alias) the path names, as the client named it."""
        return self.parameters.get("collection")

    def upstream_path(self, collection: str | None = None) -> str:
        """The path and query sent to Qdrant, built from the row's template: ``collection`` is the upstream name
        of the path's collection."""
        values = {**self.parameters, **({"collection": collection} if collection is not None else {})}
        path = "/".join(_encoded(values[segment[1:-1]]) if segment.startswith("{") else segment
                        for segment in self.route.segments)
        return f"/{path}?{urlencode(self.query)}" if self.query else f"/{path}"


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")


def _encoded(value: str) -> str:
    """A path segment percent-encoded (RFC 3986: every character but the unreserved ones)."""
    return value if _UNRESERVED.fullmatch(value) else quote(value, safe="")


def _find(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The row whose template ``method path`` fills, with the parameters as given (untyped)."""
    segments = path.split("/")[1:]
    for shape in _INDEX.get((method, len(segments)), ()):
        row = shape.rows.get(shape.literals(segments))
        if row is not None:
            return row, {row.segments[n][1:-1]: segments[n] for n in shape.parameters}
    return None


def route_of(method: str, path: str) -> Route:
    """The row serving ``method path`` (its values unchecked: :func:`match` types them); 404 where no row serves
    it, 403 for a route kept from tenants (:data:`KEPT_FROM_TENANTS`), in Qdrant's error shape."""
    found = _find(method, path)
    if found is None:
        raise _refusal(method, path)
    return found[0]


def _refusal(method: str, path: str) -> ProxyError:
    segments = path.split("/")[1:]
    family = segments[2] if segments[0] == "collections" and len(segments) > 2 else segments[0]
    kept = KEPT_FROM_TENANTS.get(family)
    if kept is not None:
        return ProxyError(403, f"Forbidden: {method} {path} is not served through this proxy: {kept}",
                          code="forbidden")
    return ProxyError(404, f"Not found: {method} {path} is not a Qdrant request this proxy serves", code="not_found")


def match(method: str, path: str, query: list[tuple[str, str]] | None = None) -> QdrantCall:
    """``method path`` read against its row: typed path parameters, and ``query`` (the query string's parameters in
    order) typed; 400 for a value of the wrong type or a query parameter the row does not take (or given twice),
    else the refusals of :func:`route_of`."""
    found = _find(method, path)
    if found is None:
        raise _refusal(method, path)
    route, given = found
    typed = {name: _PARAMETERS[name](value) for name, value in given.items()}
    return QdrantCall(route, typed, _typed_query(route, query or []))


def _typed_query(route: Route, items: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for name, value in items:
        if name not in route.query:
            raise _bad(f"unknown query parameter {name!r} (this request takes {', '.join(route.query) or 'none'})")
        if name in seen:
            raise _bad(f"the query parameter {name!r} is given twice")
        seen[name] = QUERY_PARAMETERS[name](value)
    return tuple((name, seen[name]) for name in route.query if name in seen)


def collection_path(upstream_name: str) -> str:
    """``/collections/{name}`` of an upstream collection (what the search cache reads a collection's metric from)."""
    return f"/collections/{_encoded(upstream_name)}"
