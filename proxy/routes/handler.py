"""Turning an HTTP request into a :class:`RequestContext`, running a pipeline, and answering."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.context import RequestContext
from proxy.errors import Dialect, ProxyError
from proxy.headers import request_id
from proxy.pipeline import Pipeline
from proxy.routes.respond import respond

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Observer = Callable[[RequestContext, int, float], None]


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request body, or a 413 once it passes ``limit`` bytes (checked before and while reading)."""
    if request.content_length is not None and request.content_length > limit:
        raise ProxyError(413, f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes",
                         code="body_too_large")
    if request.content_length is not None:  # the common case: one read (aiohttp stops at the declared length)
        body = await request.content.read(request.content_length) if request.content_length else b""
        while len(body) < request.content_length:
            more = await request.content.read(request.content_length - len(body))
            if not more:
                raise ProxyError(400, "the request body ended before its Content-Length", code="incomplete_body")
            body += more
        return body
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_object(raw: bytes) -> dict[str, Any]:
    """A JSON object from the body, or a 400 saying what is wrong."""
    if not raw:
        raise ProxyError(400, "the request body is empty; a JSON object is expected", code="invalid_json")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ProxyError(400, "the request body must be a JSON object", code="invalid_json")
    return value


def _is_json(request: web.BaseRequest) -> bool:
    return request.content_type in ("application/json", "") or request.content_type.endswith("+json")


def make_handler(
    pipeline: Callable[[], Pipeline],
    route: str,
    dialect: Dialect,
    *,
    max_body: int,
    json_body: bool,
    path: Callable[[web.BaseRequest], str] | None = None,
    observe: Observer | None = None,
) -> Handler:
    """An aiohttp handler that runs ``pipeline()`` (looked up per request, so a config patch can swap it) for
    ``route``.

    ``json_body``: the body must be a JSON object (chat, embeddings, Qdrant searches); otherwise a JSON body is only
    checked for being well-formed when it claims to be JSON, and forwarded byte for byte.
    """

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        rid = request_id(request.headers.get("X-Request-ID"))
        ctx: RequestContext | None = None
        try:
            # The origin-form path and query only: an absolute-form target (``POST http://host/v1/...``) must not
            # reach the upstream URL, which is the configured base followed by this.
            upstream_path = path(request) if path is not None else str(request.rel_url)
            raw = await read_body(request, max_body) if request.can_read_body else b""
            body: dict[str, Any] | None = None
            if json_body:
                body = parse_object(raw)
            elif raw and _is_json(request):
                try:
                    orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise ProxyError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
            ctx = RequestContext(
                request=request, route=route, request_id=rid, raw_body=raw, body=body,
                upstream_path=upstream_path, method=request.method,
                stream=bool(body.get("stream")) if body is not None else False,
            )
            reply = await pipeline()(ctx)
        except ProxyError as exc:
            if observe is not None:
                failed = ctx or RequestContext(request=request, route=route, request_id=rid)
                failed.cache_status = failed.cache_status or "ERROR"
                observe(failed, exc.status, time.perf_counter() - started)
            return exc.response(dialect, rid)
        try:
            return await respond(request, ctx, reply, dialect)
        finally:  # also when the client hung up and the handler is being cancelled
            if observe is not None:
                observe(ctx, reply.status, time.perf_counter() - started)

    return handle
