"""Qdrant collections belong to tenants: each tenant's qdrant-client works unchanged in its own namespace, and none
reaches another's collections — listed, read, scrolled, searched, overwritten or deleted, by name, by upstream name,
through ``lookup_from``, ``with_lookup`` or an alias.

Real parts: the official qdrant-client (REST) as each tenant's client, the proxy in keys mode, the TEST-ONLY Qdrant
shim over qdrant-client's local mode behind it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import UnexpectedResponse

from proxy.search.tenancy import namespace_of
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.qdrant_shim import QdrantShim

DIM = 4
A_TEXT, B_TEXT = "A's confidential passage", "B wrote this"


@dataclass
class Tenants:
    server: ProxyServer
    shim: QdrantShim
    keys: dict[str, str]

    def client(self, who: str) -> QdrantClient:
        """``who``'s qdrant-client, pointed at the proxy with its proxy key (sent as ``api-key``)."""
        with warnings.catch_warnings():  # "Api key is used with an insecure connection": loopback, on purpose
            warnings.simplefilter("ignore")
            return QdrantClient(url=self.server.url, api_key=self.keys[who], prefer_grpc=False,
                                check_compatibility=False, timeout=30)

    def http(self, who: str, method: str, path: str, headers: dict[str, str] | None = None,
             **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.server.url + path, headers={"api-key": self.keys[who], **(headers or {})},
                             timeout=30, **kwargs)


def _tenants(shim: QdrantShim, tmp_path: Path, **settings: Any) -> Iterator[Tenants]:
    with ProxyServer(proxy_settings(qdrant_url=shim.url, **{"auth.mode": "keys", "data_dir": str(tmp_path),
                                                             **settings})) as server:
        store = server.runtime.credits.keys
        assert store is not None
        keys = {who: server.call(store.create(f"{who}-user", tenant)).plaintext
                for who, tenant in (("a", "tenant-a"), ("a2", "tenant-a"), ("b", "tenant-b"))}
        yield Tenants(server, shim, keys)


@pytest.fixture
def tenants(qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[Tenants]:
    yield from _tenants(qdrant_shim, tmp_path)


def _make(client: QdrantClient, name: str, text: str, points: int = 5) -> None:
    client.create_collection(name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    client.upsert(name, points=[models.PointStruct(id=i, vector=[1.0, i / 10, 0.5, 0.1],
                                                   payload={"text": f"{text} {i}", "n": i})
                                for i in range(1, points + 1)])


def _status(call: Any) -> int:
    try:
        call()
    except UnexpectedResponse as exc:
        return exc.status_code
    return 200


# -- each tenant's qdrant-client, unchanged ------------------------------------------------------------------------

def test_two_tenants_with_one_collection_name_keep_their_own_points(tenants: Tenants) -> None:
    a, b = tenants.client("a"), tenants.client("b")
    _make(a, "docs", A_TEXT)
    _make(b, "docs", B_TEXT, points=3)
    assert [c.name for c in a.get_collections().collections] == ["docs"]
    assert [c.name for c in b.get_collections().collections] == ["docs"]
    assert a.count("docs").count == 5 and b.count("docs").count == 3
    found_a = a.query_points("docs", query=[1.0, 0.1, 0.5, 0.1], limit=3, with_payload=True).points
    found_b = b.query_points("docs", query=[1.0, 0.1, 0.5, 0.1], limit=3, with_payload=True).points
    assert all(str(p.payload and p.payload["text"]).startswith(A_TEXT) for p in found_a)
    assert all(str(p.payload and p.payload["text"]).startswith(B_TEXT) for p in found_b)
    upstream = {c.name for c in tenants.shim.client.get_collections().collections}
    assert upstream == {namespace_of("tenant-a") + "docs", namespace_of("tenant-b") + "docs"}
    assert [c.name for c in tenants.client("a2").get_collections().collections] == ["docs"], "users share a tenant's"


def test_the_qdrant_client_surface_works_in_a_namespace(tenants: Tenants) -> None:
    client = tenants.client("a")
    assert not client.collection_exists("notes")
    _make(client, "notes", "note", points=10)
    assert client.collection_exists("notes")
    assert client.get_collection("notes").config.params.vectors.size == DIM  # type: ignore[union-attr]
    assert [p.id for p in client.retrieve("notes", ids=[1, 2, 99])] == [1, 2]
    scrolled, _ = client.scroll("notes", limit=4, with_payload=True)
    assert [p.id for p in scrolled] == [1, 2, 3, 4]
    assert client.count("notes", count_filter=models.Filter(must=[models.FieldCondition(
        key="n", range=models.Range(gte=6))])).count == 5
    query = [1.0, 0.3, 0.5, 0.1]
    assert client.query_points("notes", query=query, limit=1).points[0].id == 3
    batch = client.query_batch_points("notes", requests=[models.QueryRequest(query=query, limit=2),
                                                         models.QueryRequest(query=[1.0, 0.9, 0.5, 0.1], limit=1)])
    assert [[p.id for p in r.points] for r in batch] == [[3, 2] if batch[0].points[1].id == 2 else
                                                         [p.id for p in batch[0].points], [9]]
    recommended = client.query_points("notes", query=models.RecommendQuery(
        recommend=models.RecommendInput(positive=[3])), limit=2).points
    assert len(recommended) == 2 and 3 not in [p.id for p in recommended]
    client.set_payload("notes", payload={"tag": "x"}, points=[1, 2])
    client.overwrite_payload("notes", payload={"only": 1}, points=[3])
    client.delete_payload("notes", keys=["tag"], points=[2])
    client.clear_payload("notes", points_selector=models.PointIdsList(points=[4]))
    payloads = {p.id: p.payload for p in client.retrieve("notes", ids=[1, 2, 3, 4])}
    assert payloads[1] == {"text": "note 1", "n": 1, "tag": "x"} and payloads[2] == {"text": "note 2", "n": 2}
    assert payloads[3] == {"only": 1} and payloads[4] == {}
    client.create_payload_index("notes", field_name="n", field_schema=models.PayloadSchemaType.INTEGER)
    client.delete_payload_index("notes", field_name="n")
    client.delete("notes", points_selector=models.PointIdsList(points=[10]))
    assert client.count("notes").count == 9
    client.update_collection_aliases(change_aliases_operations=[models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name="notes", alias_name="current"))])
    assert [(x.alias_name, x.collection_name) for x in client.get_aliases().aliases] == [("current", "notes")]
    assert [x.alias_name for x in client.get_collection_aliases("notes").aliases] == ["current"]
    assert client.query_points("current", query=query, limit=1).points[0].id == 3, "searched through the alias"
    client.update_collection_aliases(change_aliases_operations=[models.RenameAliasOperation(
        rename_alias=models.RenameAlias(old_alias_name="current", new_alias_name="latest"))])
    assert [x.alias_name for x in client.get_aliases().aliases] == ["latest"]
    client.update_collection_aliases(change_aliases_operations=[models.DeleteAliasOperation(
        delete_alias=models.DeleteAlias(alias_name="latest"))])
    assert client.get_aliases().aliases == []
    assert client.delete_collection("notes")
    assert not client.collection_exists("notes") and client.get_collections().collections == []


def test_legacy_search_and_recommend_routes_work_in_a_namespace(tenants: Tenants) -> None:
    _make(tenants.client("a"), "old", "legacy", points=6)
    searched = tenants.http("a", "POST", "/collections/old/points/search",
                            json={"vector": [1.0, 0.2, 0.5, 0.1], "limit": 2, "with_payload": True})
    assert searched.status_code == 200 and searched.json()["result"][0]["id"] == 2
    batch = tenants.http("a", "POST", "/collections/old/points/search/batch",
                         json={"searches": [{"vector": [1.0, 0.2, 0.5, 0.1], "limit": 1}]})
    assert batch.status_code == 200 and batch.json()["result"][0][0]["id"] == 2
    recommended = tenants.http("a", "POST", "/collections/old/points/recommend", json={"positive": [2], "limit": 1})
    assert recommended.status_code == 200 and len(recommended.json()["result"]) == 1


# -- this round's attacks: each succeeded before collections belonged to tenants --------------------------------

@pytest.fixture
def victim(tenants: Tenants) -> Tenants:
    _make(tenants.client("a"), "a_private", A_TEXT)
    return tenants


def test_b_does_not_list_a_collections(victim: Tenants) -> None:
    assert victim.client("b").get_collections().collections == []
    assert victim.client("b").get_aliases().aliases == []
    assert not victim.client("b").collection_exists("a_private")


def test_b_cannot_read_scroll_count_or_search_a_points(victim: Tenants) -> None:
    b = victim.client("b")
    for call in (lambda: b.retrieve("a_private", ids=[1], with_payload=True),
                 lambda: b.scroll("a_private", limit=10, with_payload=True),
                 lambda: b.count("a_private"),
                 lambda: b.query_points("a_private", query=[1.0, 0.1, 0.5, 0.1], with_payload=True),
                 lambda: b.get_collection("a_private")):
        assert _status(call) == 404
    for method, path, body in (("GET", "/collections/a_private/points/1", None),
                               ("POST", "/collections/a_private/points/search", {"vector": [1, 0, 0, 0]})):
        answer = victim.http("b", method, path, json=body)
        assert answer.status_code == 404 and A_TEXT not in answer.text


def test_b_cannot_name_a_collection_by_its_upstream_name(victim: Tenants) -> None:
    upstream = namespace_of("tenant-a") + "a_private"
    answer = victim.http("b", "POST", f"/collections/{upstream}/points/scroll", json={"with_payload": True})
    assert answer.status_code == 404 and A_TEXT not in answer.text
    assert namespace_of("tenant-b") not in answer.text, "error messages name B's collections as B named them"
    assert f"Collection `{upstream}` doesn't exist" in answer.text, "the name B gave: its own namespace lacks it"


def test_b_cannot_overwrite_a_point(victim: Tenants) -> None:
    b = victim.client("b")
    assert _status(lambda: b.upsert("a_private", points=[models.PointStruct(
        id=1, vector=[1.0, 0.1, 0.5, 0.1], payload={"text": B_TEXT})])) == 404
    assert _status(lambda: b.set_payload("a_private", payload={"text": B_TEXT}, points=[1])) == 404
    assert _status(lambda: b.overwrite_payload("a_private", payload={"text": B_TEXT}, points=[1])) == 404
    best = victim.client("a").query_points("a_private", query=[1.0, 0.1, 0.5, 0.1], limit=1, with_payload=True)
    assert best.points[0].payload == {"text": f"{A_TEXT} 1", "n": 1}


def test_b_cannot_delete_a_points_or_collection(victim: Tenants) -> None:
    b = victim.client("b")
    _status(lambda: b.delete("a_private", points_selector=models.PointIdsList(points=[1, 2])))
    _status(lambda: b.delete("a_private", points_selector=models.FilterSelector(filter=models.Filter())))
    _status(lambda: b.clear_payload("a_private", points_selector=models.PointIdsList(points=[1])))
    _status(lambda: b.delete_collection("a_private"))
    a = victim.client("a")
    assert a.collection_exists("a_private") and a.count("a_private").count == 5
    assert a.retrieve("a_private", ids=[1])[0].payload == {"text": f"{A_TEXT} 1", "n": 1}


def test_b_cannot_reach_a_points_through_lookup_from_with_lookup_or_an_alias(victim: Tenants) -> None:
    b = victim.client("b")
    _make(b, "b_docs", B_TEXT)
    for path, body in (
            ("query", {"query": 1, "lookup_from": {"collection": "a_private"}, "with_payload": True}),
            ("query", {"prefetch": [{"query": 1, "lookup_from": {"collection": "a_private"}}],
                       "query": {"fusion": "rrf"}, "with_payload": True}),
            ("query/groups", {"query": [1.0, 0.1, 0.5, 0.1], "group_by": "n", "with_lookup": "a_private"})):
        answer = victim.http("b", "POST", f"/collections/b_docs/points/{path}", json=body)
        assert answer.status_code in (400, 404), answer.text  # the shim says 400 for a lookup collection it lacks
        assert A_TEXT not in answer.text and "ragproxy_t_" not in answer.text, answer.text
    assert _status(lambda: b.update_collection_aliases(change_aliases_operations=[models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name="a_private", alias_name="stolen"))])) == 404
    assert _status(lambda: b.scroll("stolen", with_payload=True)) == 404


def test_a_cannot_be_given_another_tenant_s_alias(victim: Tenants) -> None:
    """B's alias names are B's: an alias B makes under one of A's names lands in B's namespace."""
    b = victim.client("b")
    _make(b, "b_docs", B_TEXT)
    b.update_collection_aliases(change_aliases_operations=[models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name="b_docs", alias_name="a_private"))])
    a = victim.client("a")
    best = a.query_points("a_private", query=[1.0, 0.1, 0.5, 0.1], limit=1, with_payload=True).points[0]
    assert best.payload == {"text": f"{A_TEXT} 1", "n": 1}
    assert a.get_aliases().aliases == []


# -- the operator's grants ------------------------------------------------------------------------------------------

@pytest.fixture
def granted(qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[Tenants]:
    """A collection made outside the proxy, shared with tenant-a to write and every tenant to read."""
    _make(qdrant_shim.client, "catalog", "catalog")  # type: ignore[arg-type]
    _make(qdrant_shim.client, "unlisted", "unlisted")  # type: ignore[arg-type]
    grants = {"catalog": {"read": ["*"], "write": ["tenant-a"]}}
    yield from _tenants(qdrant_shim, tmp_path, **{"upstreams.qdrant.collections": grants})


def test_collections_made_outside_the_proxy_are_reached_only_as_granted(granted: Tenants) -> None:
    a, b = granted.client("a"), granted.client("b")
    assert [c.name for c in b.get_collections().collections] == ["catalog"]
    assert not b.collection_exists("unlisted") and _status(lambda: b.count("unlisted")) == 404
    assert b.count("catalog").count == 5
    write = models.PointStruct(id=9, vector=[1.0, 0.0, 0.0, 0.0], payload={"text": B_TEXT})
    assert _status(lambda: b.upsert("catalog", points=[write])) == 403
    assert _status(lambda: b.delete("catalog", points_selector=models.PointIdsList(points=[1]))) == 403
    assert _status(lambda: b.delete_collection("catalog")) == 403
    a.upsert("catalog", points=[write])
    assert b.count("catalog").count == 6, "tenant-a writes points of the collection shared with it to write"
    for client in (a, b):
        assert _status(lambda c=client: c.delete_collection("catalog")) == 403  # type: ignore[misc]
        assert _status(lambda c=client: c.create_payload_index(  # type: ignore[misc]
            "catalog", field_name="n", field_schema=models.PayloadSchemaType.INTEGER)) == 403
        assert _status(lambda c=client: c.update_collection_aliases(  # type: ignore[misc]
            change_aliases_operations=[models.CreateAliasOperation(create_alias=models.CreateAlias(
                collection_name="catalog", alias_name="mine"))])) == 403, "an alias would give every right"
    assert granted.shim.client.collection_exists("catalog")
    refused = granted.http("b", "POST", "/collections/catalog/points/query", json={"query": [1, 0, 0, 0]},
                           headers={"X-Cache-Invalidate": "collection"})
    assert refused.status_code == 403, "dropping a shared collection's cached searches needs the right to write"


def test_an_operator_s_alias_in_a_namespace_hands_an_existing_collection_to_its_tenant(granted: Tenants) -> None:
    granted.shim.client.update_collection_aliases(change_aliases_operations=[models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name="unlisted", alias_name=namespace_of("tenant-b") + "legacy"))])
    b = granted.client("b")
    assert b.count("legacy").count == 5
    b.set_payload("legacy", payload={"owner": "b"}, points=[1])
    assert granted.shim.client.retrieve("unlisted", ids=[1])[0].payload == {"text": "unlisted 1", "n": 1, "owner": "b"}
    assert _status(lambda: granted.client("a").count("legacy")) == 404


def test_a_tenant_reads_a_granted_collection_through_lookup_from(granted: Tenants) -> None:
    b = granted.client("b")
    _make(b, "mine", B_TEXT)
    looked_up = b.query_points("mine", query=3, lookup_from=models.LookupLocation(collection="catalog"), limit=1)
    assert looked_up.points and looked_up.points[0].id == 3


# -- the anonymous tenant of an open proxy ------------------------------------------------------------------------

def test_an_open_proxy_keeps_qdrant_names_for_the_anonymous_tenant_but_not_the_keyed_ones(
        qdrant_shim: QdrantShim, tmp_path: Path) -> None:
    _make(qdrant_shim.client, "existing", "existing")  # type: ignore[arg-type]
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{"data_dir": str(tmp_path),
                                                             "credits.enabled": True})  # (a key store in open mode)
    with ProxyServer(settings) as server:
        store, ledger = server.runtime.credits.keys, server.runtime.credits.store
        assert settings.auth.mode == "open" and store is not None and ledger is not None
        key = server.call(store.create("keyed-user", "keyed")).plaintext
        for user, tenant in (("keyed-user", "keyed"), ("anonymous", "anonymous")):
            server.call(ledger.top_up(user, 10**9, tenant=tenant))
        anonymous = QdrantClient(url=server.url, prefer_grpc=False, check_compatibility=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            keyed = QdrantClient(url=server.url, api_key=key, prefer_grpc=False, check_compatibility=False)
        _make(keyed, "secret", A_TEXT)
        assert [c.name for c in anonymous.get_collections().collections] == ["existing"], "the proxy's own hidden"
        assert anonymous.count("existing").count == 5
        upstream = namespace_of("keyed") + "secret"
        assert _status(lambda: anonymous.scroll(upstream, with_payload=True)) == 403
        assert _status(lambda: anonymous.delete_collection(upstream)) == 403
        assert keyed.get_collections().collections[0].name == "secret" and not keyed.collection_exists("existing")
        _make(anonymous, "fresh", "fresh")
        assert qdrant_shim.client.collection_exists("fresh"), "under its own name, as before the proxy"


def test_an_open_proxy_may_give_the_anonymous_tenant_a_namespace(qdrant_shim: QdrantShim, tmp_path: Path) -> None:
    _make(qdrant_shim.client, "existing", "existing")  # type: ignore[arg-type]
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{"data_dir": str(tmp_path),
                                                             "upstreams.qdrant.anonymous": "namespace"})
    with ProxyServer(settings) as server:
        anonymous = QdrantClient(url=server.url, prefer_grpc=False, check_compatibility=False)
        assert anonymous.get_collections().collections == [] and not anonymous.collection_exists("existing")
        _make(anonymous, "fresh", "fresh")
        assert qdrant_shim.client.collection_exists(namespace_of("anonymous") + "fresh")
