"""The data-plane aiohttp application: OpenAI routes, Qdrant REST routes, health, and JSON errors for the rest."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from aiohttp import web

from proxy.assembly import build_pipelines
from proxy.config import Settings
from proxy.errors import Dialect, ProxyError
from proxy.pipeline import Pipeline
from proxy.routes.handler import Handler, make_handler
from proxy.routes.health import health_routes
from proxy.runtime import Runtime

log = logging.getLogger("ragproxy.app")

RUNTIME = web.AppKey("runtime", Runtime)

# Qdrant REST paths the proxy forwards (everything else outside /v1 is a 404 of ours).
_QDRANT_PREFIXES = ("/collections", "/aliases", "/cluster", "/telemetry", "/snapshots", "/locks", "/issues")
_QDRANT_SEARCH = re.compile(r"^/collections/[^/]+/points/(search|query|recommend|discover)(/batch)?$")
_QDRANT_WRITE_METHODS = frozenset({"PUT", "POST", "PATCH", "DELETE"})


def _dialect_for(path: str) -> Dialect:
    return Dialect.OPENAI if path.startswith("/v1") else Dialect.QDRANT


def _safe_qdrant_path(request: web.Request) -> str:
    """The raw path to forward, refusing dot segments and encoded slashes (no path traversal upstream)."""
    raw = request.raw_path
    lowered = raw.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in raw:
        raise ProxyError(400, "encoded slashes are not allowed in Qdrant paths", code="bad_path")
    segments = request.path.split("/")
    if any(segment in ("..", ".") for segment in segments):
        raise ProxyError(400, "dot segments are not allowed in Qdrant paths", code="bad_path")
    return raw


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router errors (404/405) and anything unexpected become JSON in the route's dialect, never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return ProxyError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_")).response(
            _dialect_for(request.path)
        )
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return ProxyError(500, "internal proxy error", code="internal_error").response(_dialect_for(request.path))


def create_app(settings: Settings, runtime: Runtime | None = None) -> web.Application:
    """Build the data-plane application (components start with the app and stop with it)."""
    rt = runtime or Runtime(settings)
    rt.pipelines = build_pipelines(rt)
    app = web.Application(middlewares=[json_errors], client_max_size=settings.server.max_body_bytes + 1)
    app[RUNTIME] = rt
    limit = settings.server.max_body_bytes

    def current(name: str) -> Callable[[], Pipeline]:
        return lambda: getattr(rt.pipelines, name)

    def openai(pipeline_route: str, json_body: bool) -> Handler:
        return make_handler(current(pipeline_route), pipeline_route, Dialect.OPENAI,
                            max_body=limit, json_body=json_body, observe=rt.observe)

    async def qdrant(request: web.Request) -> web.StreamResponse:
        try:
            _safe_qdrant_path(request)
        except ProxyError as exc:
            return exc.response(Dialect.QDRANT)
        if request.method == "POST" and _QDRANT_SEARCH.match(request.path):
            return await qdrant_search(request)
        if request.method in _QDRANT_WRITE_METHODS:
            return await qdrant_write(request)
        return await qdrant_other(request)

    qdrant_search = make_handler(current("qdrant_search"), "qdrant_search", Dialect.QDRANT, max_body=limit,
                                 json_body=True, observe=rt.observe)
    qdrant_write = make_handler(current("qdrant_write"), "qdrant_write", Dialect.QDRANT, max_body=limit,
                                json_body=False, observe=rt.observe)
    qdrant_other = make_handler(current("qdrant_passthrough"), "qdrant", Dialect.QDRANT, max_body=limit,
                                json_body=False, observe=rt.observe)

    app.router.add_routes(health_routes(rt))
    app.router.add_post("/v1/chat/completions", openai("chat", True))
    app.router.add_post("/v1/completions", openai("completions", True))
    app.router.add_post("/v1/embeddings", openai("embeddings", True))
    app.router.add_route("*", "/v1/{tail:.*}", openai("llm_passthrough", False))
    app.router.add_get("/", qdrant)
    for prefix in _QDRANT_PREFIXES:
        app.router.add_route("*", prefix, qdrant)
        app.router.add_route("*", prefix + "/{tail:.*}", qdrant)

    async def on_startup(_: web.Application) -> None:
        await rt.start()

    async def on_cleanup(_: web.Application) -> None:
        await rt.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
