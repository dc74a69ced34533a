"""The data plane: one request handler for aiohttp's low-level server, routing by path to the pipelines.

Why not an ``aiohttp.web.Application``: the data plane has a dozen fixed routes, and an application's router,
middleware chain and per-request match info cost about as much CPU per request as the whole pass-through
pipeline (``python -m loadtest.bench overhead``; BENCHMARKS.md). :class:`DataPlane` resolves a request with one
dict lookup and a few prefix tests, and turns everything that is not a pipeline's answer — an unknown path (404),
a wrong method (405), an unexpected exception (500, logged) — into JSON in the route's dialect, never a traceback.
The admin API, with its many routes and its authentication middleware, stays an application on its own port.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` run their pipelines; any other
``/v1/...`` is passed through (any method, those three paths with another method too); ``GET /healthz`` and
``/readyz``; ``GET /`` and everything under the Qdrant prefixes below go to the Qdrant pipelines.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

from proxy.assembly import build_pipelines
from proxy.config import Settings
from proxy.errors import Dialect, ProxyError
from proxy.pipeline import Pipeline
from proxy.routes.handler import Handler, make_handler
from proxy.routes.health import health_handlers
from proxy.runtime import Runtime

log = logging.getLogger("ragproxy.app")

# Qdrant REST paths the proxy forwards (everything else outside /v1 is a 404 of ours).
_QDRANT_PREFIXES = ("/collections", "/aliases", "/cluster", "/telemetry", "/snapshots", "/locks", "/issues")
_QDRANT_SEARCH = re.compile(r"^/collections/[^/]+/points/(search|query|recommend|discover)(/batch)?$")
_QDRANT_WRITE_METHODS = frozenset({"PUT", "POST", "PATCH", "DELETE"})


def _dialect_for(path: str) -> Dialect:
    return Dialect.OPENAI if path.startswith("/v1") else Dialect.QDRANT


def _safe_qdrant_path(request: web.BaseRequest) -> str:
    """The raw path to forward, refusing dot segments and encoded slashes (no path traversal upstream)."""
    raw = request.raw_path
    lowered = raw.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in raw:
        raise ProxyError(400, "encoded slashes are not allowed in Qdrant paths", code="bad_path")
    segments = request.path.split("/")
    if any(segment in ("..", ".") for segment in segments):
        raise ProxyError(400, "dot segments are not allowed in Qdrant paths", code="bad_path")
    return raw


def _is_qdrant_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in _QDRANT_PREFIXES)


class DataPlane:
    """The data-plane handler (``web.Server(DataPlane(settings))``); :attr:`runtime` is started and stopped by
    whoever serves it (:func:`proxy.serve.serve`)."""

    def __init__(self, settings: Settings, runtime: Runtime | None = None) -> None:
        rt = runtime or Runtime(settings)
        rt.pipelines = build_pipelines(rt)
        self.runtime = rt
        limit = settings.server.max_body_bytes

        def handler(name: str, route: str, dialect: Dialect, json_body: bool) -> Handler:
            def current() -> Pipeline:  # looked up per request: a config patch may swap the pipelines
                return getattr(rt.pipelines, name)  # type: ignore[no-any-return]

            return make_handler(current, route, dialect, max_body=limit, json_body=json_body, observe=rt.observe)

        healthz, readyz = health_handlers(rt)
        self._exact: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): handler("chat", "chat", Dialect.OPENAI, True),
            ("POST", "/v1/completions"): handler("completions", "completions", Dialect.OPENAI, True),
            ("POST", "/v1/embeddings"): handler("embeddings", "embeddings", Dialect.OPENAI, True),
        }
        for method in ("GET", "HEAD"):
            self._exact[(method, "/healthz")] = healthz
            self._exact[(method, "/readyz")] = readyz
            self._exact[(method, "/")] = self._qdrant
        self._get_only = frozenset({"/healthz", "/readyz", "/"})
        self._llm_passthrough = handler("llm_passthrough", "llm_passthrough", Dialect.OPENAI, False)
        self._qdrant_search = handler("qdrant_search", "qdrant_search", Dialect.QDRANT, True)
        self._qdrant_write = handler("qdrant_write", "qdrant_write", Dialect.QDRANT, False)
        self._qdrant_other = handler("qdrant_passthrough", "qdrant", Dialect.QDRANT, False)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        try:
            return await self._resolve(request.method, path)(request)
        except ProxyError as exc:
            return exc.response(_dialect_for(path))
        except web.HTTPException as exc:  # raised by aiohttp while reading a request
            if exc.status < 400:
                raise
            return ProxyError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_")).response(
                _dialect_for(path)
            )
        except Exception:
            log.exception("unhandled error on %s %s", request.method, path)
            return ProxyError(500, "internal proxy error", code="internal_error").response(_dialect_for(path))

    def _resolve(self, method: str, path: str) -> Handler:
        exact = self._exact.get((method, path))
        if exact is not None:
            return exact
        if path.startswith("/v1/"):
            return self._llm_passthrough
        if path in self._get_only:
            raise ProxyError(405, "Method Not Allowed", code="method_not_allowed", headers={"Allow": "GET,HEAD"})
        if _is_qdrant_path(path):
            return self._qdrant
        raise ProxyError(404, "Not Found", code="not_found")

    async def _qdrant(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            _safe_qdrant_path(request)
        except ProxyError as exc:
            return exc.response(Dialect.QDRANT)
        if request.method == "POST" and _QDRANT_SEARCH.match(request.path):
            return await self._qdrant_search(request)
        if request.method in _QDRANT_WRITE_METHODS:
            return await self._qdrant_write(request)
        return await self._qdrant_other(request)


def create_server(plane: DataPlane) -> web.Server:
    """aiohttp's low-level server around ``plane``; a client that hangs up cancels its request's handler."""
    return web.Server(plane, handler_cancellation=True, access_log=None)
