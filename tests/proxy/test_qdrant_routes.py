"""The table of Qdrant routes: every route of Qdrant's REST API is a row or refused on purpose, each row's body
fields cover qdrant-client's models, and values are typed before anything is built from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import qdrant_client
from qdrant_client.http import models

from proxy.core.errors import ProxyError
from proxy.search import routes
from proxy.search.routes import KEPT_FROM_TENANTS, ROUTES, Body, Kind, match, route_of

PROXY_OWN = {("GET", "/healthz"), ("GET", "/livez"), ("GET", "/readyz")}
"""Qdrant's health routes: the proxy answers /healthz and /readyz itself, and forwards none of them."""


def _client_api() -> set[tuple[str, str]]:
    """(method, path template) of every request qdrant-client's REST API modules make."""
    found: set[tuple[str, str]] = set()
    for module in (Path(qdrant_client.__file__).parent / "http" / "api").glob("*_api.py"):
        text = module.read_text(encoding="utf-8")
        found |= {(method, re.sub(r"\{(\w+)\}", "{x}", url))
                  for method, url in re.findall(r'method="(\w+)",\s*url="([^"]+)"', text)}
    return found


def _row_of(method: str, template: str) -> str:
    path = template.replace("{x}", "name")
    try:
        return f"row {route_of(method, path).template}"
    except ProxyError as refused:
        return f"refused {refused.status}"


def test_every_route_of_the_client_api_is_a_row_or_refused_on_purpose() -> None:
    api = _client_api()
    assert len(api) > 60, "qdrant-client's API modules were not read"
    decided = {(method, template): _row_of(method, template) for method, template in api - PROXY_OWN}
    undecided = {key: value for key, value in decided.items() if value == "refused 404"}
    assert not undecided, f"routes of Qdrant's API with no decision (a row, or KEPT_FROM_TENANTS): {undecided}"
    rows = {(row.method, re.sub(r"\{(\w+)\}", "{x}", row.template)) for row in ROUTES}
    legacy = {(method, template) for method, template in rows - api if "/points/" in template}
    assert rows - api == legacy | {("HEAD", "/")}, "rows beyond the client's API are the legacy searches only"
    assert {(m, t) for (m, t), v in decided.items() if v == "refused 403"} >= {
        ("GET", "/telemetry"), ("GET", "/cluster"), ("POST", "/snapshots"), ("GET", "/metrics"), ("GET", "/issues"),
        ("PUT", "/collections/{x}/snapshots/recover"), ("POST", "/collections/{x}/cluster")}


MODELS = {  # the body model(s) of each row, as qdrant-client names them
    ("PUT", "/collections/{collection}"): ("CreateCollection",),
    ("PATCH", "/collections/{collection}"): ("UpdateCollection",),
    ("PUT", "/collections/{collection}/index"): ("CreateFieldIndex",),
    ("PUT", "/collections/{collection}/vectors/{vector_name}"): ("DenseVectorNameConfig", "SparseVectorNameConfig"),
    ("POST", "/collections/aliases"): ("ChangeAliasesOperation",),
    ("PUT", "/collections/{collection}/points"): ("PointsList", "PointsBatch"),
    ("POST", "/collections/{collection}/points"): ("PointRequest",),
    ("POST", "/collections/{collection}/points/delete"): ("PointIdsList", "FilterSelector"),
    ("PUT", "/collections/{collection}/points/vectors"): ("UpdateVectors",),
    ("POST", "/collections/{collection}/points/vectors/delete"): ("DeleteVectors",),
    ("POST", "/collections/{collection}/points/payload"): ("SetPayload",),
    ("PUT", "/collections/{collection}/points/payload"): ("SetPayload",),
    ("POST", "/collections/{collection}/points/payload/delete"): ("DeletePayload",),
    ("POST", "/collections/{collection}/points/payload/clear"): ("PointIdsList", "FilterSelector"),
    ("POST", "/collections/{collection}/points/batch"): ("UpdateOperations",),
    ("POST", "/collections/{collection}/points/scroll"): ("ScrollRequest",),
    ("POST", "/collections/{collection}/points/count"): ("CountRequest",),
    ("POST", "/collections/{collection}/facet"): ("FacetRequest",),
    ("POST", "/collections/{collection}/points/query"): ("QueryRequest",),
    ("POST", "/collections/{collection}/points/query/batch"): ("QueryRequest",),  # each search of the batch
    ("POST", "/collections/{collection}/points/query/groups"): ("QueryGroupsRequest",),
    ("POST", "/collections/{collection}/points/search/matrix/pairs"): ("SearchMatrixRequest",),
    ("POST", "/collections/{collection}/points/search/matrix/offsets"): ("SearchMatrixRequest",),
}


def test_each_row_forwards_every_field_of_the_client_s_models() -> None:
    for (method, template), names in MODELS.items():
        row = next(row for row in ROUTES if (row.method, row.template) == (method, template))
        for name in names:
            model = getattr(models, name, None)
            if model is not None:  # an older qdrant-client may lack it
                assert set(model.model_fields) <= row.fields, (template, name, set(model.model_fields) - row.fields)
    nested = {routes.PREFETCH_FIELDS: "Prefetch", routes.LOOKUP_FIELDS: "LookupLocation",
              routes.WITH_LOOKUP_FIELDS: "WithLookup"}
    for fields, name in nested.items():
        assert set(getattr(models, name).model_fields) <= fields, name
    for action, (field, *_) in routes.ALIAS_ACTIONS.items():
        model = getattr(models, "".join(part.title() for part in action.split("_")))
        assert set(model.model_fields) == set(routes.ALIAS_ACTIONS[action]), (action, field)
    assert all(row.body is not Body.NONE or not row.fields for row in ROUTES)


def test_the_cached_searches_are_the_search_cache_s_routes() -> None:
    from normalizer.search_request import route as cacheable

    for row in ROUTES:
        assert (row.kind is Kind.SEARCH) == (cacheable(row.example) is not None), row.template


@pytest.mark.parametrize(("method", "path", "query", "upstream"), [
    ("GET", "/collections/docs/points/1", [], "/collections/up/points/1"),
    ("GET", "/collections/docs/points/5C56C793-69F3-4FBF-87E6-C4BF54C28C26", [("consistency", "majority")],
     "/collections/up/points/5c56c793-69f3-4fbf-87e6-c4bf54c28c26?consistency=majority"),
    ("PUT", "/collections/docs/points", [("ordering", "strong"), ("wait", "true")],
     "/collections/up/points?wait=true&ordering=strong"),
    ("DELETE", "/collections/docs/index/meta.source", [("wait", "false")],
     "/collections/up/index/meta.source?wait=false"),
    ("POST", "/collections/aliases", [("timeout", "07")], "/collections/aliases?timeout=7"),
    ("GET", "/", [], "/"),
])
def test_the_upstream_request_is_rebuilt_from_typed_values(method: str, path: str, query: list[tuple[str, str]],
                                                           upstream: str) -> None:
    call = match(method, path, query)
    assert call.upstream_path("up" if call.collection is not None else None) == upstream


def test_names_are_percent_encoded_when_rebuilt() -> None:
    call = match("GET", "/collections/my docs/exists")
    assert call.collection == "my docs"
    assert call.upstream_path("ragproxy_t_0123456789abcdef_my docs#1") == \
        "/collections/ragproxy_t_0123456789abcdef_my%20docs%231/exists"


@pytest.mark.parametrize(("method", "path", "query"), [
    ("GET", "/collections/docs/points/abc", []),
    ("GET", "/collections/docs/points/18446744073709551616", []),
    ("GET", "/collections/a%b", []),
    ("GET", "/collections/a;b", []),
    ("GET", "/collections/a*b", []),
    ("GET", "/collections/a\ufffdb", []),
    ("GET", "/collections/" + "x" * 256, []),
    ("GET", "/collections/docs", [("wait", "true")]),
    ("PUT", "/collections/docs/points", [("wait", "yes")]),
    ("PUT", "/collections/docs/points", [("wait", "true"), ("wait", "false")]),
    ("POST", "/collections/docs/points/search", [("consistency", "some")]),
    ("PUT", "/collections/docs", [("timeout", "-1")]),
])
def test_values_of_the_wrong_type_are_refused(method: str, path: str, query: list[tuple[str, str]]) -> None:
    with pytest.raises(ProxyError) as refused:
        match(method, path, query)
    assert refused.value.status == 400 and refused.value.message.startswith("Bad request: ")


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/snapshots", 403), ("POST", "/collections/docs/snapshots/upload", 403),
    ("GET", "/collections/docs/cluster", 403), ("PUT", "/collections/docs/shards", 403),
    ("POST", "/locks", 403), ("GET", "/telemetry", 403), ("DELETE", "/issues", 403),
    ("GET", "/collections/docs/optimizations", 403),
    ("GET", "/collections/docs/points", 404), ("PUT", "/collections", 404), ("POST", "/collections/docs", 404),
    ("GET", "/collections/docs/points/1/payload", 404), ("OPTIONS", "/", 404), ("GET", "/livez", 404),
])
def test_what_no_row_serves_is_refused(method: str, path: str, status: int) -> None:
    with pytest.raises(ProxyError) as refused:
        route_of(method, path)
    assert refused.value.status == status
    assert ("Forbidden: " if status == 403 else "Not found: ") in refused.value.message


def test_a_literal_segment_wins_over_a_parameter() -> None:
    assert route_of("POST", "/collections/aliases").body is Body.ALIASES
    assert route_of("GET", "/collections/aliases").template == "/collections/{collection}"
    assert set(KEPT_FROM_TENANTS) >= {"snapshots", "cluster", "telemetry", "locks", "issues"}
