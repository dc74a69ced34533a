"""The stage that builds every Qdrant request from its row, in the tenant's namespace, and maps the answer back.

:class:`BuildQdrantRequest` runs right after identify (and the search limits) in each Qdrant pipeline:

1. the request is read against :data:`proxy.search.routes.ROUTES` (404/403 for what no row serves, 400 for a path
   parameter or query parameter of the wrong type);
2. the tenant's view (:mod:`proxy.search.tenancy`) maps the path's collection to its upstream name, if the tenant
   has the row's right there (``X-Cache-Invalidate`` needs the right to write);
3. the body — parsed as JSON (orjson: no NaN, no invalid UTF-8, no lone surrogates) whatever its ``Content-Type``,
   and required to be an object where the row takes one, refused where it takes none — is mapped
   (:mod:`proxy.search.bodies`) and goes upstream re-serialised (the ``qdrant.names`` patch);
4. ``ctx.upstream_path`` is rebuilt from the row's template and the typed values: the client's path never reaches
   Qdrant;
5. on the way back, listings and error messages are mapped back to the tenant's names (:mod:`proxy.search.answers`).

The search cache after it reads the upstream path and the mapped body, so its keys and invalidations are by
upstream collection: one tenant's ``docs`` is never another's.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Next
from proxy.search.answers import tenant_answer
from proxy.search.bodies import BodyMapper
from proxy.search.routes import Access, Body, match
from proxy.search.stages import INVALIDATE
from proxy.search.tenancy import CollectionAccess


def _parsed(raw: bytes) -> Any:
    if not raw:
        raise ProxyError(400, "Bad request: the request body is empty; a JSON object is expected", code="invalid_json")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"Bad request: the request body is not valid JSON: {exc}", code="invalid_json") from None


class BuildQdrantRequest:
    """Build the upstream request of a Qdrant route in the tenant's namespace (module docstring)."""

    name = "qdrant"
    needs = frozenset({"tenant", "api_key_id"})
    gives = frozenset({"upstream_path"})

    def __init__(self, access: CollectionAccess, *, prefetch_depth: int) -> None:
        self.access = access
        self.prefetch_depth = prefetch_depth

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        request = ctx.request
        call = match(ctx.method, request.path, list(request.query.items()))
        route = call.route
        view = self.access.view(ctx.tenant, identified=ctx.api_key_id is not None)
        collection = None
        if call.collection is not None and route.access is not None:
            invalidating = request.headers.get(INVALIDATE, "").strip().lower() == "collection"
            collection = view.upstream(call.collection, max(route.access, Access.WRITE) if invalidating
                                       else route.access)
        if route.body is Body.NONE:
            if ctx.raw_body:
                raise ProxyError(400, f"Bad request: {ctx.method} {request.path} takes no body", code="bad_request")
        else:
            sent = BodyMapper(view, self.prefetch_depth).upstream_body(
                route, ctx.body if ctx.body is not None else _parsed(ctx.raw_body))
            ctx.patch("qdrant.names", lambda _client_body: sent)  # the first patch: the whole body, mapped
        ctx.upstream_path = call.upstream_path(collection)
        return tenant_answer(route, await call_next(ctx), view)
