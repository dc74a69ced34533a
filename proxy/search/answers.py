"""Qdrant's answers as a tenant sees them: the names in them mapped back, what it does not reach left out. Pure.

* ``GET /collections``: the collections the tenant reaches, under its names (:meth:`~proxy.search.tenancy.
  TenantView.visible`);
* ``GET /aliases`` and ``GET /collections/{c}/aliases``: the aliases whose name and collection the tenant both
  reaches, under its names;
* an error (any status from 400): the tenant's namespace taken out of its text (Qdrant names the upstream collection
  in messages such as "Collection `…` doesn't exist!"), so the tenant reads its own name.

Other answers name no collection (a search's points and payloads are the tenant's data, returned as they are). A
listing that cannot be read is not forwarded (502): it may name what the tenant must not see.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.errors import ProxyError
from proxy.core.reply import Reply
from proxy.search.routes import Listing, Route
from proxy.search.tenancy import TenantView


def tenant_answer(route: Route, reply: Reply, view: TenantView) -> Reply:
    """``reply`` to a request of ``route``, as the tenant of ``view`` may see it (changed in place)."""
    if reply.status < 400 and route.listing is Listing.NONE:
        return reply
    if reply.body is None:  # Qdrant answers JSON, never a stream
        raise ProxyError(502, "Qdrant answered with a stream where a JSON body was expected", code="bad_upstream")
    if reply.status >= 400:
        reply.body = view.scrub(reply.body)
    elif reply.status == 200:
        reply.body = _listing(route.listing, reply.body, view)
    return reply


def _listing(listing: Listing, body: bytes, view: TenantView) -> bytes:
    try:
        document = orjson.loads(body)
        result = document["result"]
        if listing is Listing.COLLECTIONS:
            names = [str(entry["name"]) for entry in result["collections"]]
            result["collections"] = [{"name": name} for name in view.visible(names)]
        else:
            result["aliases"] = [mapped for mapped in (_alias(entry, view) for entry in result["aliases"])
                                 if mapped is not None]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ProxyError(502, f"Qdrant's list of {listing.value} could not be read ({exc.__class__.__name__})",
                         code="bad_upstream") from None
    return orjson.dumps(document)


def _alias(entry: Any, view: TenantView) -> dict[str, str] | None:
    alias, collection = view.client_name(str(entry["alias_name"])), view.client_name(str(entry["collection_name"]))
    if alias is None or collection is None:
        return None
    return {"alias_name": alias, "collection_name": collection}
