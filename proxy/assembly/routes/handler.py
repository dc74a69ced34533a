"""Turning an HTTP request into a :class:`RequestContext`, running a pipeline, and answering.

What goes upstream is built here from what was checked, never relayed: the upstream path and query from the
route's row (``target``: :func:`normalizer.paths.upstream_target`), the body from what the strict parser read
(:func:`normalizer.json_body.read_body`). A body must be one strictly valid JSON object sent as JSON (a
``Content-Type`` of ``application/json``, ``*/*+json`` or none); anything else is a 400 in the route's error shape,
on every route, and no route forwards bytes it could not parse.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from normalizer.cache_control import split_proxy_fields
from normalizer.json_body import BodyProblem, read_body
from normalizer.paths import QueryProblem, Target
from proxy.assembly.routes.respond import respond
from proxy.core.context import RequestContext
from proxy.core.errors import Dialect, ProxyError
from proxy.core.headers import request_id
from proxy.core.outcome import CacheStatus, Outcome
from proxy.core.pipeline import Pipeline
from proxy.server.request import Request
from proxy.server.responder import Responder

Handler = Callable[[Request, Responder], Awaitable[None]]
Observer = Callable[[RequestContext, int, float], None]
Targeter = Callable[[Request], "Target | None"]
"""A route's upstream path and query for a request (``None``: not its path); a
:class:`~normalizer.paths.QueryProblem` for a query string it does not take."""


def built_by_stage(_request: Request) -> Target:
    """No upstream path yet: the route's own stage builds it from its row (the Qdrant routes: the qdrant stage,
    :class:`proxy.search.requests.BuildQdrantRequest`, in the tenant's namespace)."""
    return Target("", {})


def _json_type(request: Request) -> bool:
    """Whether the body is declared JSON (or not declared at all)."""
    declared = request.headers.get("Content-Type")
    if declared is None or declared == "application/json":
        return True
    kind = request.content_type
    return kind == "application/json" or kind.endswith("+json")


def read_request_body(request: Request, *, required: bool) -> tuple[dict[str, Any] | None, bytes]:
    """The JSON object a request's body holds and its re-serialisation (``None, b""`` when it has none and none is
    ``required``), or a 400 saying what is wrong with it."""
    raw = request.body
    if not raw:
        if required:
            raise ProxyError(400, "the request body is empty; a JSON object is expected", code="invalid_json")
        return None, b""
    if not _json_type(request):
        raise ProxyError(400, f"the request body must be sent as application/json, not {request.content_type!r}",
                         code="invalid_content_type")
    try:
        return read_body(raw)
    except BodyProblem as exc:
        raise ProxyError(400, str(exc), code=exc.code) from None


def make_handler(
    pipeline: Pipeline,
    route: str,
    dialect: Dialect,
    *,
    max_body: int,
    json_body: bool,
    target: Targeter,
    forwards_body: bool = True,
    lift_proxy_fields: bool = False,
    observe: Observer | None = None,
) -> Handler:
    """A data-plane handler that runs ``pipeline`` for ``route``.

    ``target``: the upstream path and query, built from the route's row. ``json_body``: the body must be a JSON
    object (chat, embeddings, Qdrant searches); otherwise a body is optional, and read the same way when there is
    one. ``forwards_body``: the route's upstream request carries the body (a row that takes none accepts an empty
    object at most, and sends nothing). ``max_body``: the route's body limit (413 beyond).
    ``lift_proxy_fields``: the proxy's own body objects (``cache``, ``ragproxy``) are taken out of the body into
    ``ctx.proxy_fields`` and never forwarded.
    """

    async def handle(request: Request, out: Responder) -> None:
        started = time.perf_counter()
        rid = request_id(request.headers.get("X-Request-ID"))
        ctx: RequestContext | None = None
        try:
            if request.body_too_large or len(request.body) > max_body:
                raise ProxyError(413, f"request body exceeds the limit of {max_body} bytes", code="body_too_large")
            try:
                built = target(request)
            except QueryProblem as exc:
                raise ProxyError(400, str(exc), code="unknown_parameter", param=exc.param) from None
            if built is None:
                raise ProxyError(404, f"Invalid URL ({request.method} {request.path})", code="not_found")
            body, written = read_request_body(request, required=json_body)
            if not forwards_body and body:
                raise ProxyError(400, f"{request.method} {request.path} takes no request body",
                                 code="unknown_parameter", param=next(iter(body)))
            lifted: dict[str, Any] = {}
            if lift_proxy_fields and body is not None:  # never forwarded: outgoing_body re-serialises without them
                body, lifted = split_proxy_fields(body)
            ctx = RequestContext(
                request=request, route=route, request_id=rid, raw_body=request.body,
                body=body if forwards_body else None, written_body=written if forwards_body else b"",
                proxy_fields=lifted, upstream_path=built.path, path_params=built.params, method=request.method,
                stream=bool(body.get("stream")) if body is not None else False,
            )
            reply = await pipeline(ctx)
        except ProxyError as exc:
            if observe is not None:
                failed = ctx or RequestContext(request=request, route=route, request_id=rid)
                failed.outcome = failed.outcome or Outcome(CacheStatus.ERROR)
                observe(failed, exc.status, time.perf_counter() - started)
            exc.send(out, dialect, rid)
            return
        try:
            await respond(out, ctx, reply, dialect)
        finally:  # also when the client hung up and the handler is being cancelled
            if observe is not None:
                observe(ctx, reply.status, time.perf_counter() - started)

    return handle
