"""Qdrant across tenants (``bench abuse``): can tenant B reach tenant A's collections through the proxy?

Against a replica of the abuse run (API keys, credits) in front of the TEST-ONLY Qdrant shim. Tenant A makes a
collection through the proxy, fills it with points whose payloads carry a marker, and gives it an alias. Tenant B
then tries every way this round's black-box attack took and the others Qdrant's API offers, each under A's name and
under A's upstream name (what B could guess or learn: :func:`proxy.search.tenancy.namespace_of`):

* **reads**: list collections and aliases; describe, check and list the aliases of A's collection; retrieve, get,
  scroll, count, query (single, batch, groups), the legacy search and recommend; from B's own collection, a query
  with ``lookup_from`` A's collection and groups ``with_lookup`` it; an alias of B's to A's collection, then a
  scroll through it. A read is a 2xx whose body carries A's marker or A's collection's name, says it exists or
  counts its points, or — for ``lookup_from``, ``with_lookup`` and the alias — any 2xx (A's vectors were used);
* **writes**: upsert over A's point, set, overwrite, delete and clear its payloads, update its vectors, delete its
  points by id and by filter, a batch update, a payload index, deleting A's alias and A's collection. After each,
  A reads its collection back (points, payloads, vectors, its alias): a change is a write, and A's collection is
  made again for the next attempt; a 2xx of the index creation counts too (it changes A's collection's schema);
* **routes kept from tenants**: telemetry, cluster, snapshots, issues, locks — a 2xx is a route open to tenants.

Figures: ``qdrant_cross_tenant_reads``, ``qdrant_cross_tenant_writes`` and ``qdrant_kept_routes_open`` (each 0 is
the goal); the reads are added to the run's ``cross_tenant_reads``.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from loadtest.bench._tally import Tally, send
from proxy.search.tenancy import namespace_of

SCENARIO = "qdrant_tenants"
COLLECTION, ALIAS, OWN = "abuse_a_docs", "abuse_a_live", "abuse_b_own"
MARKER = "A-only marker 7f3c"
VECTOR = [1.0, 0.2, 0.5, 0.1]
POINTS = [{"id": n, "vector": [1.0, n / 10, 0.5, 0.1], "payload": {"text": f"{MARKER} {n}", "n": n}}
          for n in range(1, 6)]
ALWAYS_A_READ = ("lookup_from", "with_lookup", "alias_then_scroll")
"""Attacks whose any 2xx used A's points."""


def _reads(name: str) -> list[tuple[str, str, str, Any]]:
    """(attack, method, path, body) of the reads B tries against the collection ``name``."""
    c = f"/collections/{name}"
    return [
        ("list_collections", "GET", "/collections", None), ("list_aliases", "GET", "/aliases", None),
        ("describe", "GET", c, None), ("exists", "GET", c + "/exists", None),
        ("collection_aliases", "GET", c + "/aliases", None),
        ("retrieve", "POST", c + "/points", {"ids": [1, 2], "with_payload": True}),
        ("get_point", "GET", c + "/points/1", None),
        ("scroll", "POST", c + "/points/scroll", {"limit": 100, "with_payload": True}),
        ("count", "POST", c + "/points/count", {"exact": True}),
        ("query", "POST", c + "/points/query", {"query": VECTOR, "with_payload": True}),
        ("query_batch", "POST", c + "/points/query/batch", {"searches": [{"query": VECTOR, "with_payload": True}]}),
        ("query_groups", "POST", c + "/points/query/groups", {"query": VECTOR, "group_by": "n",
                                                               "with_payload": True}),
        ("search", "POST", c + "/points/search", {"vector": VECTOR, "with_payload": True}),
        ("recommend", "POST", c + "/points/recommend", {"positive": [1], "with_payload": True}),
        ("lookup_from", "POST", f"/collections/{OWN}/points/query",
         {"query": 1, "lookup_from": {"collection": name}, "with_payload": True}),
        ("with_lookup", "POST", f"/collections/{OWN}/points/query/groups",
         {"query": VECTOR, "group_by": "n", "with_lookup": {"collection": name, "with_payload": True}}),
    ]


def _writes(name: str) -> list[tuple[str, str, str, Any]]:
    """(attack, method, path, body) of the writes B tries against the collection ``name``."""
    p = f"/collections/{name}/points"
    ids = {"points": [1]}
    return [
        ("upsert_over", "PUT", p + "?wait=true", {"points": [{"id": 1, "vector": VECTOR,
                                                               "payload": {"text": "B wrote this"}}]}),
        ("set_payload", "POST", p + "/payload?wait=true", {"payload": {"text": "B wrote this"}, **ids}),
        ("overwrite_payload", "PUT", p + "/payload?wait=true", {"payload": {"text": "B wrote this"}, **ids}),
        ("delete_payload", "POST", p + "/payload/delete?wait=true", {"keys": ["text"], **ids}),
        ("clear_payload", "POST", p + "/payload/clear?wait=true", ids),
        ("update_vectors", "PUT", p + "/vectors?wait=true", {"points": [{"id": 1, "vector": [0.0, 1.0, 0.0, 0.0]}]}),
        ("delete_points", "POST", p + "/delete?wait=true", ids),
        ("delete_by_filter", "POST", p + "/delete?wait=true", {"filter": {}}),
        ("batch_update", "POST", p + "/batch?wait=true", {"operations": [{"delete": {"points": [2]}}]}),
        ("payload_index", "PUT", f"/collections/{name}/index?wait=true",
         {"field_name": "n", "field_schema": "integer"}),
        ("delete_alias", "POST", "/collections/aliases", {"actions": [{"delete_alias": {"alias_name": ALIAS}}]}),
        ("delete_collection", "DELETE", f"/collections/{name}", None),
    ]


KEPT = [("GET", "/telemetry"), ("GET", "/cluster"), ("GET", "/snapshots"), ("POST", f"/collections/{COLLECTION}"
        "/snapshots"), ("GET", "/issues"), ("POST", "/locks")]


def _read_something(attack: str, response: httpx.Response | None, names: tuple[str, ...]) -> bool:
    if response is None or not response.is_success:
        return False
    if attack in ALWAYS_A_READ:
        return True
    try:
        result = orjson.loads(response.content).get("result")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    text = response.text
    return (MARKER in text or any(name in text for name in names)
            or (isinstance(result, dict) and (result.get("exists") is True or bool(result.get("count")))))


async def cross_tenant(url: str, owner: dict[str, str], other: dict[str, str], owner_tenant: str,
                       tally: Tally) -> dict[str, Any]:
    """Tenant B (``other``) at the collection of tenant A (``owner``, of ``owner_tenant``): what B read, what B
    changed, and which kept routes answered."""
    statuses: dict[str, int | None] = {}
    reads = writes = kept_open = 0
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:

        async def call(who: dict[str, str], method: str, path: str, body: Any = None) -> httpx.Response | None:
            return await send(client, tally, SCENARIO, method, path, headers=who, json=body)

        async def make_a() -> Any:
            await call(owner, "DELETE", f"/collections/{COLLECTION}")
            await call(owner, "PUT", f"/collections/{COLLECTION}", {"vectors": {"size": 4, "distance": "Cosine"}})
            await call(owner, "PUT", f"/collections/{COLLECTION}/points?wait=true", {"points": POINTS})
            await call(owner, "POST", "/collections/aliases", {"actions": [{"create_alias": {
                "alias_name": ALIAS, "collection_name": COLLECTION}}]})
            return await state_of_a()

        async def state_of_a() -> Any:
            scrolled = await call(owner, "POST", f"/collections/{COLLECTION}/points/scroll",
                                  {"limit": 100, "with_payload": True, "with_vector": True})
            aliases = await call(owner, "GET", f"/collections/{COLLECTION}/aliases")
            return (scrolled.json().get("result") if scrolled is not None and scrolled.is_success else None,
                    aliases.json().get("result") if aliases is not None and aliases.is_success else None)

        original = await make_a()
        await call(other, "PUT", f"/collections/{OWN}", {"vectors": {"size": 4, "distance": "Cosine"}})
        await call(other, "PUT", f"/collections/{OWN}/points?wait=true", {"points": [
            {"id": n, "vector": [1.0, n / 10, 0.5, 0.1], "payload": {"n": n}} for n in range(1, 6)]})
        upstream = namespace_of(owner_tenant) + COLLECTION
        for name, label in ((COLLECTION, "by_name"), (upstream, "by_upstream_name")):
            for attack, method, path, body in _reads(name):
                response = await call(other, method, path, body)
                statuses[f"{label}.{attack}"] = response.status_code if response is not None else None
                reads += _read_something(attack, response, (COLLECTION, upstream, ALIAS))
            aliased = await call(other, "POST", "/collections/aliases", {"actions": [{"create_alias": {
                "alias_name": "abuse_b_alias", "collection_name": name}}]})
            through = await call(other, "POST", "/collections/abuse_b_alias/points/scroll", {"with_payload": True})
            statuses[f"{label}.alias_then_scroll"] = through.status_code if through is not None else None
            reads += aliased is not None and aliased.is_success and _read_something("alias_then_scroll", through, ())
            await call(other, "POST", "/collections/aliases", {"actions": [{"delete_alias": {
                "alias_name": "abuse_b_alias"}}]})
            for attack, method, path, body in _writes(name):
                response = await call(other, method, path, body)
                statuses[f"{label}.{attack}"] = response.status_code if response is not None else None
                changed = await state_of_a() != original or (
                    attack == "payload_index" and response is not None and response.is_success)
                if changed:
                    writes += 1
                    original = await make_a()
        for method, path in KEPT:
            response = await call(other, method, path)
            statuses[f"kept.{method} {path}"] = response.status_code if response is not None else None
            kept_open += response is not None and response.is_success
    tally.cross_tenant_reads += reads
    return {"reads": reads, "writes": writes, "kept_routes_open": kept_open, "attempts": len(statuses),
            "statuses": statuses}
