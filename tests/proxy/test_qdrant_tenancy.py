"""The pure decisions of Qdrant tenancy: what a tenant's names mean upstream, what it may do there, which body
fields name collections, and what an answer shows it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import ProxyError
from proxy.core.reply import Reply
from proxy.search.answers import tenant_answer
from proxy.search.bodies import BodyMapper
from proxy.search.routes import Access, match, route_of
from proxy.search.tenancy import CollectionAccess, TenantView, namespace_of
from proxy.upstream.settings import CollectionGrant, QdrantUpstream

GRANTS = {"catalog": CollectionGrant(read=["*"], write=["acme"]), "finance": CollectionGrant(read=["globex"])}
ACCESS = CollectionAccess(GRANTS, anonymous_upstream=True)
ACME = ACCESS.view("acme", identified=True)
GLOBEX = ACCESS.view("globex", identified=True)
ANONYMOUS = ACCESS.view("anonymous", identified=False)


def _refusal(call: Any) -> int:
    with pytest.raises(ProxyError) as refused:
        call()
    return refused.value.status


def test_namespaces_are_per_tenant_and_fixed() -> None:
    assert namespace_of("acme") == namespace_of("acme") != namespace_of("globex")
    assert namespace_of("acme").startswith("ragproxy_t_") and len(namespace_of("acme")) == 28
    assert ACME.upstream("docs", Access.MANAGE) == namespace_of("acme") + "docs"
    assert GLOBEX.upstream("docs", Access.MANAGE) == namespace_of("globex") + "docs"


@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_no_name_of_one_tenant_is_a_name_of_another(name: str, other: str) -> None:
    assert ACME.upstream(name, Access.READ) != GLOBEX.upstream(other, Access.READ) or name in GRANTS


def test_another_tenant_s_upstream_name_lands_in_one_s_own_namespace() -> None:
    theirs = GLOBEX.upstream("docs", Access.READ)
    assert ACME.upstream(theirs, Access.MANAGE) == namespace_of("acme") + theirs


def test_grants_give_their_level_and_never_manage() -> None:
    assert ACME.upstream("catalog", Access.WRITE) == "catalog" == GLOBEX.upstream("catalog", Access.READ)
    assert _refusal(lambda: GLOBEX.upstream("catalog", Access.WRITE)) == 403
    assert _refusal(lambda: ACME.upstream("catalog", Access.MANAGE)) == 403
    assert GLOBEX.upstream("finance", Access.READ) == "finance"
    assert ACME.upstream("finance", Access.READ) == namespace_of("acme") + "finance", "not granted to acme"


def test_the_anonymous_tenant_of_an_open_proxy_keeps_qdrant_s_names_but_not_the_proxy_s() -> None:
    assert ANONYMOUS.upstream("docs", Access.MANAGE) == "docs"
    assert _refusal(lambda: ANONYMOUS.upstream(namespace_of("acme") + "docs", Access.READ)) == 403
    assert _refusal(lambda: ANONYMOUS.upstream("ragproxy_semantic", Access.READ)) == 403
    confined = CollectionAccess(GRANTS, anonymous_upstream=False).view("anonymous", identified=False)
    assert confined.upstream("docs", Access.READ) == namespace_of("anonymous") + "docs"
    assert ACCESS.view("anonymous", identified=True).namespace == namespace_of("anonymous"), "a key's tenant"


def test_names_too_long_for_a_namespace_are_refused() -> None:
    assert ACME.upstream("x" * 227, Access.READ).endswith("x" * 227)
    assert _refusal(lambda: ACME.upstream("x" * 228, Access.READ)) == 400
    assert ANONYMOUS.upstream("x" * 255, Access.READ) == "x" * 255


def test_a_tenant_sees_its_own_and_granted_collections_once() -> None:
    upstream = [namespace_of("acme") + "docs", namespace_of("globex") + "docs", "catalog", "finance",
                namespace_of("acme") + "catalog", "unlisted", "ragproxy_semantic"]
    assert ACME.visible(upstream) == ["docs", "catalog"]
    assert GLOBEX.visible(upstream) == ["docs", "catalog", "finance"]
    assert ANONYMOUS.visible(upstream) == ["catalog", "finance", "unlisted"]


def test_grants_are_read_from_the_settings() -> None:
    settings = QdrantUpstream(collections={"catalog": {"read": ["*"]}}, anonymous="namespace")  # type: ignore[arg-type]
    view = CollectionAccess.from_settings(settings).view("x", identified=False)
    assert view.namespace == namespace_of("x") and view.granted == {"catalog": Access.READ}
    with pytest.raises(ValueError, match="proxy's own"):
        QdrantUpstream(collections={"ragproxy_t_x": {"read": ["*"]}})  # type: ignore[dict-item]


# -- bodies -------------------------------------------------------------------------------------------------------

def _mapped(view: TenantView, method: str, path: str, body: Any, depth: int = 64) -> Any:
    return BodyMapper(view, depth).upstream_body(route_of(method, path), body)


def test_lookup_from_is_mapped_at_every_level_of_a_query() -> None:
    own = namespace_of("acme")
    body = {"query": 1, "lookup_from": {"collection": "other", "vector": "v"},
            "prefetch": [{"query": 2, "lookup_from": {"collection": "catalog"},
                          "prefetch": {"query": 3, "lookup_from": {"collection": "deep"}}}], "limit": 3}
    mapped = _mapped(ACME, "POST", "/collections/docs/points/query", body)
    assert mapped["lookup_from"] == {"collection": own + "other", "vector": "v"}
    assert mapped["prefetch"][0]["lookup_from"] == {"collection": "catalog"}
    assert mapped["prefetch"][0]["prefetch"]["lookup_from"] == {"collection": own + "deep"}
    assert body["lookup_from"]["collection"] == "other", "the client's body is left as it was"
    batch = _mapped(ACME, "POST", "/collections/docs/points/query/batch",
                    {"searches": [{"query": 1, "lookup_from": {"collection": "x"}}, {"query": [1, 0]}]})
    assert batch["searches"][0]["lookup_from"]["collection"] == own + "x"
    recommend = _mapped(ACME, "POST", "/collections/docs/points/recommend/batch",
                        {"searches": [{"positive": [1], "lookup_from": {"collection": "x"}}]})
    assert recommend["searches"][0]["lookup_from"]["collection"] == own + "x"


def test_with_lookup_init_from_and_alias_actions_are_mapped() -> None:
    own = namespace_of("acme")
    grouped = _mapped(ACME, "POST", "/collections/docs/points/query/groups",
                      {"query": [1, 0], "group_by": "g", "with_lookup": "people"})
    assert grouped["with_lookup"] == own + "people"
    grouped = _mapped(ACME, "POST", "/collections/docs/points/search/groups",
                      {"vector": [1, 0], "group_by": "g",
                       "with_lookup": {"collection": "people", "with_payload": True}})
    assert grouped["with_lookup"] == {"collection": own + "people", "with_payload": True}
    created = _mapped(ACME, "PUT", "/collections/docs", {"vectors": {"size": 2, "distance": "Dot"},
                                                         "init_from": {"collection": "old"}})
    assert created["init_from"] == {"collection": own + "old"}
    actions = _mapped(ACME, "POST", "/collections/aliases", {"actions": [
        {"create_alias": {"collection_name": "docs", "alias_name": "live"}},
        {"rename_alias": {"old_alias_name": "live", "new_alias_name": "prod"}},
        {"delete_alias": {"alias_name": "prod"}}]})
    assert actions == {"actions": [
        {"create_alias": {"alias_name": own + "live", "collection_name": own + "docs"}},
        {"rename_alias": {"old_alias_name": own + "live", "new_alias_name": own + "prod"}},
        {"delete_alias": {"alias_name": own + "prod"}}]}


@pytest.mark.parametrize(("view", "method", "path", "body", "status"), [
    (ACME, "POST", "/collections/docs/points/query", {"query": 1, "lookup_collection": "x"}, 400),
    (ACME, "POST", "/collections/docs/points/query", {"prefetch": {"query": 1, "from": "x"}}, 400),
    (ACME, "POST", "/collections/docs/points/query", {"lookup_from": {"collection": "x", "peer": 1}}, 400),
    (ACME, "POST", "/collections/docs/points/query", {"lookup_from": {"collection": 5}}, 400),
    (ACME, "POST", "/collections/docs/points/query", {"lookup_from": "x"}, 400),
    (ACME, "POST", "/collections/docs/points/query", {"lookup_from": {"collection": "a/b"}}, 400),
    (ACME, "POST", "/collections/docs/points/query/batch", {"searches": [{"query": 1}], "extra": 1}, 400),
    (ACME, "POST", "/collections/docs/points/query/batch", {"searches": [5]}, 400),
    (ACME, "POST", "/collections/docs/points/query/groups", {"group_by": "g", "with_lookup": {"name": "x"}}, 400),
    (ACME, "PUT", "/collections/docs", {"init_from": {"collection": "x", "shard": 1}}, 400),
    (ACME, "PUT", "/collections/docs/points", {"points": [], "collection": "x"}, 400),
    (ACME, "POST", "/collections/aliases", {"actions": [{"create_alias": {"alias_name": "x"}}]}, 400),
    (ACME, "POST", "/collections/aliases", {"actions": [{"create_alias": {"alias_name": "x",
                                                                          "collection_name": "y", "z": 1}}]}, 400),
    (ACME, "POST", "/collections/aliases", {"actions": [{"swap_alias": {}}]}, 400),
    (ACME, "POST", "/collections/aliases", {"actions": [{"create_alias": {"alias_name": "x",
                                                                          "collection_name": "catalog"}}]}, 403),
    (ACME, "POST", "/collections/aliases", {"actions": [{"delete_alias": {"alias_name": "catalog"}}]}, 403),
    (GLOBEX, "POST", "/collections/docs/points/query", {"lookup_from": {"collection": "finance"}}, None),
    (ANONYMOUS, "POST", "/collections/docs/points/query",
     {"lookup_from": {"collection": "ragproxy_t_0123456789abcdef_docs"}}, 403),
    (ANONYMOUS, "POST", "/collections/aliases",
     {"actions": [{"create_alias": {"alias_name": "steal", "collection_name": "ragproxy_semantic"}}]}, 403),
    (ACME, "POST", "/collections/docs/points/query", ["not an object"], 400),
])
def test_bodies_that_could_name_a_collection_unmapped_are_refused(view: TenantView, method: str, path: str,
                                                                 body: Any, status: int | None) -> None:
    if status is None:
        _mapped(view, method, path, body)
        return
    assert _refusal(lambda: _mapped(view, method, path, body)) == status


def test_prefetch_nests_no_deeper_than_qdrant_allows() -> None:
    prefetch: dict[str, Any] = {"query": 1}
    for _ in range(5):
        prefetch = {"prefetch": prefetch, "query": 1}
    _mapped(ACME, "POST", "/collections/docs/points/query", prefetch, depth=5)
    assert _refusal(lambda: _mapped(ACME, "POST", "/collections/docs/points/query", prefetch, depth=4)) == 400


# -- answers ------------------------------------------------------------------------------------------------------

def _answer(view: TenantView, path: str, status: int, body: Any) -> Any:
    reply = Reply(status=status, body=orjson.dumps(body))
    return orjson.loads(tenant_answer(match("GET", path).route, reply, view).body or b"")


def test_listings_show_a_tenant_its_own_names_only() -> None:
    own, other = namespace_of("acme"), namespace_of("globex")
    listed = _answer(ACME, "/collections", 200, {"result": {"collections": [
        {"name": own + "docs"}, {"name": other + "docs"}, {"name": "catalog"}, {"name": "finance"}]},
        "status": "ok", "time": 0.1})
    assert listed == {"result": {"collections": [{"name": "docs"}, {"name": "catalog"}]}, "status": "ok", "time": 0.1}
    aliases = _answer(ACME, "/aliases", 200, {"result": {"aliases": [
        {"alias_name": own + "live", "collection_name": own + "docs"},
        {"alias_name": other + "live", "collection_name": other + "docs"},
        {"alias_name": "shop", "collection_name": "catalog"},
        {"alias_name": "catalog", "collection_name": "catalog_v2"}]}, "status": "ok", "time": 0})
    assert aliases["result"]["aliases"] == [{"alias_name": "live", "collection_name": "docs"}]


def test_error_messages_name_the_tenant_s_collections_as_it_does() -> None:
    own = namespace_of("acme")
    error = _answer(ACME, "/collections/docs", 404,
                    {"status": {"error": f"Not found: Collection `{own}docs` doesn't exist!"}, "time": 0})
    assert error["status"]["error"] == "Not found: Collection `docs` doesn't exist!"


def test_an_unreadable_listing_is_not_forwarded() -> None:
    reply = Reply(status=200, body=b'{"result": {"collections": "everything"}}')
    assert _refusal(lambda: tenant_answer(route_of("GET", "/collections"), reply, ACME)) == 502
