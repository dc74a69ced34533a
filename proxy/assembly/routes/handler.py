"""Turning an HTTP request into a :class:`RequestContext`, running a pipeline, and answering."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from normalizer.cache_control import split_proxy_fields
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


def unreadable(exc: orjson.JSONDecodeError) -> ProxyError:
    """The 400 for a body the JSON parser refused: one nested past the parser's limit (1,024 levels) is said to be
    too deep, as one within it but past ``limits.json_depth`` is, not to be invalid."""
    if str(exc).startswith("depth limit exceeded"):
        return ProxyError(400, "the request body nests too deeply: more than 1024 levels", code="nesting_too_deep")
    return ProxyError(400, f"the request body is not valid JSON: {exc}", code="invalid_json")


def parse_object(raw: bytes) -> dict[str, Any]:
    """A JSON object from the body, or a 400 saying what is wrong."""
    if not raw:
        raise ProxyError(400, "the request body is empty; a JSON object is expected", code="invalid_json")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise unreadable(exc) from None
    if not isinstance(value, dict):
        raise ProxyError(400, "the request body must be a JSON object", code="invalid_json")
    return value


def _is_json(request: Request) -> bool:
    return request.content_type in ("application/json", "") or request.content_type.endswith("+json")


def make_handler(
    pipeline: Pipeline,
    route: str,
    dialect: Dialect,
    *,
    max_body: int,
    json_body: bool,
    lift_proxy_fields: bool = False,
    observe: Observer | None = None,
) -> Handler:
    """A data-plane handler that runs ``pipeline`` for ``route``.

    ``json_body``: the body must be a JSON object (chat, embeddings, Qdrant searches); otherwise a JSON body is only
    checked for being well-formed when it claims to be JSON, and forwarded byte for byte. ``lift_proxy_fields``:
    the proxy's own body objects (``cache``, ``ragproxy``) are taken out of the body into ``ctx.proxy_fields``
    and never forwarded.
    """

    async def handle(request: Request, out: Responder) -> None:
        started = time.perf_counter()
        rid = request_id(request.headers.get("X-Request-ID"))
        ctx: RequestContext | None = None
        try:
            if request.body_too_large:
                raise ProxyError(413, f"request body exceeds the limit of {max_body} bytes", code="body_too_large")
            raw = request.body
            body: dict[str, Any] | None = None
            if json_body:
                body = parse_object(raw)
            elif raw and _is_json(request):
                try:
                    orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise unreadable(exc) from None
            lifted: dict[str, Any] = {}
            if lift_proxy_fields and body is not None:  # never forwarded: outgoing_body re-serialises without them
                body, lifted = split_proxy_fields(body)
            ctx = RequestContext(
                request=request, route=route, request_id=rid, raw_body=raw, body=body, proxy_fields=lifted,
                upstream_path=request.raw_path, method=request.method,
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
