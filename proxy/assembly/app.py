"""The data plane: one request handler for the data plane's server (:mod:`proxy.server`), routing by path to the
pipelines.

:class:`DataPlane` resolves a request with one dict lookup and a few prefix tests (the data plane has a dozen
fixed routes; a router and a middleware chain would cost more per request than the pass-through pipeline), and
turns everything that is not a pipeline's answer — an unknown path (404), a wrong method (405), an unexpected
exception (500, logged by the server) — into JSON in the route's dialect, never a traceback. The admin API, with
its many routes and its authentication middleware, is an aiohttp application on its own port.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/embeddings`` run their
pipelines; rerankers ``POST /v1/rerank``, ``/v2/rerank``, ``/rerank`` (Cohere/Jina/vLLM, or TEI's shape) and
``/v1/score``, ``/score`` (vLLM) run the rerank pipeline; everything under ``/v1/responses/`` (a stored response
by id, its input items, cancel; ``input_tokens``, ``compact``) runs the stored-responses pipeline; another ``/v1/...``
request is passed through (billed per request) only when ``upstreams.llm_passthrough`` allows it, else 404 (405 on an
LLM API's path); ``GET /healthz`` and
``/readyz``; every other path is a Qdrant request: a row of :data:`proxy.search.routes.ROUTES` picks its pipeline
(a cacheable search, a write, anything else) and the qdrant stage builds the upstream request from the row, in the
tenant's namespace; what no row serves is refused there (404, 403 for a route kept from tenants) before any
pipeline runs. ``GET /`` is Qdrant's when a Qdrant upstream is configured (qdrant-client reads the server version
there); without one, it describes the proxy (:mod:`proxy.assembly.routes.about`). Before any of this, a path that
servers read differently (dot segments, ``//``, encoded dots and slashes) is refused
(:func:`normalizer.paths.path_problem`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from normalizer.paths import PathAllowList, path_problem
from proxy.assembly.config import Settings
from proxy.assembly.pipelines import build_pipelines
from proxy.assembly.routes.about import about_handler
from proxy.assembly.routes.handler import Handler, make_handler
from proxy.assembly.routes.health import health_handlers
from proxy.assembly.runtime import Runtime
from proxy.core.endpoints import ENDPOINTS, Endpoint
from proxy.core.errors import Dialect, ProxyError
from proxy.core.pipeline import Pipeline
from proxy.search.routes import ROUTES as QDRANT_ROUTES
from proxy.search.routes import Kind, route_of
from proxy.server.connection import HttpServer
from proxy.server.request import Request
from proxy.server.responder import Responder
from proxy.stored.stages import PREFIX as RESPONSES_PREFIX

_OPENAI_FIRST_SEGMENTS = frozenset({"v1"} | {path.split("/")[1] for endpoint in ENDPOINTS for path in endpoint.paths
                                             if endpoint.dialect is Dialect.OPENAI})  # none is the Qdrant API's


def _dialect_for(path: str) -> Dialect:
    """The dialect of a path's errors, from its first segment (read through repeated slashes and backslashes, so
    that a refused trick is answered in the dialect of the route it aimed at)."""
    first = re.split(r"[/\\]+", path.lstrip("/\\"), maxsplit=1)[0]
    return Dialect.OPENAI if first in _OPENAI_FIRST_SEGMENTS else Dialect.QDRANT


def _error_body(path: str, status: int, message: str, code: str) -> bytes:
    """The body of an error the server answers itself (malformed request, handler failure)."""
    return ProxyError(status, message, code=code).body(_dialect_for(path))


class DataPlane:
    """The data-plane handler (served by :func:`create_server`); :attr:`runtime` is started and stopped by
    whoever serves it (:func:`proxy.commands.serve.serve`)."""

    def __init__(self, settings: Settings, runtime: Runtime | None = None,
                 endpoints: Iterable[Endpoint] = ENDPOINTS) -> None:
        """``endpoints``: the rows served (all of :data:`~proxy.core.endpoints.ENDPOINTS` but in tests)."""
        rt = runtime or Runtime(settings)
        self.runtime = rt
        self.pipelines = pipelines = build_pipelines(rt, endpoints)  # once: a config patch changes them in place
        limit = self.max_body = settings.server.max_body_bytes

        def handler(pipeline: Pipeline, route: str, dialect: Dialect, json_body: bool) -> Handler:
            return make_handler(pipeline, route, dialect, max_body=limit, json_body=json_body,
                                lift_proxy_fields=json_body and dialect is Dialect.OPENAI, observe=rt.observe)

        healthz, readyz = health_handlers(rt)
        self._exact: dict[tuple[str, str], Handler] = {}  # each endpoint row at each of its paths
        for endpoint, pipeline in pipelines.served.items():
            served = handler(pipeline, endpoint.route, endpoint.dialect, True)
            self._exact.update({("POST", path): served for path in endpoint.paths})
        root = self._qdrant if settings.upstreams.qdrant.url else about_handler(settings)
        for method in ("GET", "HEAD"):
            self._exact[(method, "/healthz")] = healthz
            self._exact[(method, "/readyz")] = readyz
            self._exact[(method, "/")] = root
        self._get_only = frozenset({"/healthz", "/readyz", "/"})
        self._llm_passthrough = handler(pipelines.llm_passthrough, "llm_passthrough", Dialect.OPENAI, False)
        self._passthrough_allowed = PathAllowList(settings.upstreams.llm_passthrough)
        self._stored_responses = handler(pipelines.stored_responses, "stored_responses", Dialect.OPENAI, False)
        self._qdrant_kinds = {Kind.SEARCH: handler(pipelines.qdrant_search, "qdrant_search", Dialect.QDRANT, True),
                              Kind.WRITE: handler(pipelines.qdrant_write, "qdrant_write", Dialect.QDRANT, False),
                              Kind.READ: handler(pipelines.qdrant_read, "qdrant", Dialect.QDRANT, False)}

    def example_paths(self) -> list[tuple[str, str]]:
        """One request target of every route this plane serves, as ``(method, path)``: the fixed routes, a stored
        response, the allowed pass-through and every Qdrant row (what a test walks with every path trick)."""
        fixed = [key for key in self._exact if key[1] != "/"]
        return [*fixed, ("GET", RESPONSES_PREFIX + "resp_1"), ("POST", RESPONSES_PREFIX + "input_tokens"),
                ("GET", "/v1/models"), *((row.method, row.example) for row in QDRANT_ROUTES if row.example != "/")]

    async def __call__(self, request: Request, out: Responder) -> None:
        path = request.path
        try:
            problem = path_problem(request.raw_path, path)
            if problem is not None:  # before routing: the upstream must read the path the proxy routed on
                raise ProxyError(400, f"{problem}: {request.raw_path.partition('?')[0]!r}", code="bad_path")
            await self._resolve(request.method, path)(request, out)
        except ProxyError as exc:
            exc.send(out, _dialect_for(path))

    def _resolve(self, method: str, path: str) -> Handler:
        exact = self._exact.get((method, path))
        if exact is not None:
            return exact
        if path.startswith(RESPONSES_PREFIX):
            return self._stored_responses
        if path.startswith("/v1/"):
            if self._passthrough_allowed.allows(method, path):
                return self._llm_passthrough
            if ("POST", path) in self._exact:
                raise ProxyError(405, "Method Not Allowed", code="method_not_allowed", headers={"Allow": "POST"})
            raise ProxyError(404, f"{method} {path} is not served by this proxy (an operator may forward it: "
                                  "upstreams.llm_passthrough)", code="not_found")
        if path in self._get_only:
            raise ProxyError(405, "Method Not Allowed", code="method_not_allowed", headers={"Allow": "GET,HEAD"})
        return self._qdrant_kinds[route_of(method, path).kind]  # what no row serves: refused here

    async def _qdrant(self, request: Request, out: Responder) -> None:
        await self._qdrant_kinds[route_of(request.method, request.path).kind](request, out)


def create_server(plane: DataPlane) -> HttpServer:
    """The data plane's server around ``plane``; a client that hangs up cancels its request's handler."""
    server = plane.runtime.settings.server
    return HttpServer(plane, max_body=plane.max_body, error_body=_error_body, read_timeout_s=server.read_timeout_s,
                      head_timeout_s=server.head_timeout_s, body_timeout_s=server.body_timeout_s,
                      max_connections=server.max_connections)
