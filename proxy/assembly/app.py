"""The data plane: one request handler for the data plane's server (:mod:`proxy.server`), routing by path to the
pipelines.

:class:`DataPlane` resolves a request with one dict lookup and a few prefix tests (the data plane has a dozen
fixed routes; a router and a middleware chain would cost more per request than the pass-through pipeline), and
turns everything that is not a pipeline's answer — an unknown path (404), a wrong method (405), an unexpected
exception (500, logged by the server) — into JSON in the route's dialect, never a traceback. The admin API, with
its many routes and its authentication middleware, is an aiohttp application on its own port.

Routes: every row of :data:`proxy.core.endpoints.ROWS` at its method and exact path templates — ``POST
/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/embeddings``, the rerankers ``POST /v1/rerank``,
``/v2/rerank``, ``/rerank`` (Cohere/Jina/vLLM, or TEI's shape) and ``/v1/score``, ``/score`` (vLLM), and the requests
about a stored response (``GET``/``DELETE /v1/responses/{response_id}``, ``GET .../input_items``, ``POST
.../cancel``, ``POST /v1/responses/input_tokens`` and ``/compact``), each running its own pipeline; any other path
under ``/v1/responses/`` is a 404 (``Invalid URL``, as the upstream says it), another method on a row's path a 405.
Another ``/v1/...`` request is passed through (billed per request) only when ``upstreams.llm_passthrough`` allows
it, else 404 (405 on an LLM API's path). The upstream path of each is rebuilt from the row or pattern it matched
(:mod:`normalizer.paths`), never the client's. ``GET /healthz`` and ``/readyz``; every other path is a Qdrant
request: a row of :data:`proxy.search.routes.ROUTES` picks its pipeline (a cacheable search, a write, anything
else) and the qdrant stage builds the upstream request from the row, in the tenant's namespace; what no row serves
is refused there (404, 403 for a route kept from tenants) before any pipeline runs. ``GET /`` is Qdrant's when a
Qdrant upstream is configured (qdrant-client reads the server version there); without one, it describes the proxy
(:mod:`proxy.assembly.routes.about`). Before any of this, a path that servers read differently (dot segments,
``//``, encoded dots and slashes, ``%`` left after one decoding, ``;``, invalid UTF-8) is refused
(:func:`normalizer.paths.path_problem`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from normalizer.paths import PathAllowList, PathTemplate, Query, Target, path_problem, upstream_target
from proxy.assembly.config import Settings
from proxy.assembly.pipelines import build_pipelines
from proxy.assembly.routes.about import about_handler
from proxy.assembly.routes.handler import Handler, Targeter, built_by_stage, make_handler
from proxy.assembly.routes.health import health_handlers
from proxy.assembly.runtime import Runtime
from proxy.core.endpoints import ENDPOINTS, Endpoint, Resource
from proxy.core.errors import Dialect, ProxyError
from proxy.core.pipeline import Pipeline
from proxy.search.routes import ROUTES as QDRANT_ROUTES
from proxy.search.routes import Kind, route_of
from proxy.server.connection import HttpServer
from proxy.server.request import Request
from proxy.server.responder import Responder

RESPONSES_PREFIX = "/v1/responses/"

_OPENAI_FIRST_SEGMENTS = frozenset({"v1"} | {path.split("/")[1] for endpoint in ENDPOINTS for path in endpoint.paths
                                             if endpoint.dialect is Dialect.OPENAI})  # none is the Qdrant API's


def _dialect_for(path: str) -> Dialect:
    """The dialect of a path's errors, from its first segment (read through repeated slashes, backslashes, ``;``
    and ``%``, so that a refused trick is answered in the dialect of the route it aimed at)."""
    first = re.split(r"[/\\;%]+", path.lstrip("/\\"), maxsplit=1)[0]
    return Dialect.OPENAI if first in _OPENAI_FIRST_SEGMENTS else Dialect.QDRANT


def _error_body(path: str, status: int, message: str, code: str) -> bytes:
    """The body of an error the server answers itself (malformed request, handler failure)."""
    return ProxyError(status, message, code=code).body(_dialect_for(path))


def _row_target(template: PathTemplate, query: Query) -> Targeter:
    """A row's upstream path and query for a request, built from ``template`` and ``query`` (an exact path with no
    query string, the common case, is one target built once: the handler serves that path only)."""
    if template.literal:
        fixed = Target(template.template, {})

        def literal(request: Request) -> Target | None:
            if request.query_string or request.path != template.template:
                return upstream_target(template, query, request.path, request.query_string)
            return fixed

        return literal
    return lambda request: upstream_target(template, query, request.path, request.query_string)


class DataPlane:
    """The data-plane handler (served by :func:`create_server`); :attr:`runtime` is started and stopped by
    whoever serves it (:func:`commands.serve.serve`)."""

    def __init__(self, settings: Settings, runtime: Runtime | None = None,
                 endpoints: Iterable[Endpoint] = ENDPOINTS) -> None:
        """``endpoints``: the rows served (all of :data:`~proxy.core.endpoints.ENDPOINTS` but in tests)."""
        rt = runtime or Runtime(settings)
        self.runtime = rt
        self.pipelines = pipelines = build_pipelines(rt, endpoints)  # once: a config patch changes them in place
        limit = self.max_body = settings.server.max_body_bytes

        def handler(pipeline: Pipeline, route: str, dialect: Dialect, json_body: bool, target: Targeter) -> Handler:
            return make_handler(pipeline, route, dialect, max_body=limit, json_body=json_body, target=target,
                                lift_proxy_fields=json_body and dialect is Dialect.OPENAI, observe=rt.observe)

        healthz, readyz = health_handlers(rt)
        self._exact: dict[tuple[str, str], Handler] = {}  # each row at each of its exact paths
        self._templated: list[tuple[Resource, Handler]] = []  # the rows whose paths have typed parameters
        for endpoint, pipeline in pipelines.served.items():
            for template in endpoint.templates:
                self._exact[(endpoint.method, template.template)] = handler(
                    pipeline, endpoint.route, endpoint.dialect, True, target=_row_target(template, endpoint.query))
        for resource, pipeline in pipelines.resources.items():
            served = make_handler(pipeline, resource.route, resource.dialect,
                                  max_body=min(limit, resource.max_body_bytes or limit), json_body=resource.body,
                                  target=_row_target(resource.path, resource.query), forwards_body=resource.body,
                                  lift_proxy_fields=resource.body, observe=rt.observe)
            if resource.path.literal:
                self._exact[(resource.method, resource.path.template)] = served
            else:
                self._templated.append((resource, served))
        root = self._qdrant if settings.upstreams.qdrant.url else about_handler(settings)
        for method in ("GET", "HEAD"):
            self._exact[(method, "/healthz")] = healthz
            self._exact[(method, "/readyz")] = readyz
            self._exact[(method, "/")] = root
        self._get_only = frozenset({"/healthz", "/readyz", "/"})
        self._passthrough_allowed = allowed = PathAllowList(settings.upstreams.llm_passthrough)
        self._llm_passthrough = handler(pipelines.llm_passthrough, "llm_passthrough", Dialect.OPENAI, False,
                                        target=lambda request: allowed.target(request.method, request.path,
                                                                              request.query_string))
        self._qdrant_kinds = {
            Kind.SEARCH: handler(pipelines.qdrant_search, "qdrant_search", Dialect.QDRANT, True, built_by_stage),
            Kind.WRITE: handler(pipelines.qdrant_write, "qdrant_write", Dialect.QDRANT, False, built_by_stage),
            Kind.READ: handler(pipelines.qdrant_read, "qdrant", Dialect.QDRANT, False, built_by_stage)}

    def example_paths(self) -> list[tuple[str, str]]:
        """One request target of every route this plane serves, as ``(method, path)``: each row at each of its
        paths (typed parameters filled with their example values), the fixed routes, each allowed pass-through
        pattern and every Qdrant row (what a test walks with every path trick)."""
        rows = [(method, template.example()) for method, template in self.row_paths()]
        passthrough = [("GET" if method == "*" else method, template.example())
                       for method, template in self._passthrough_allowed.patterns]
        fixed = [key for key in self._exact if key[1] in ("/healthz", "/readyz")]
        return [*rows, *fixed, *passthrough,
                *((row.method, row.example) for row in QDRANT_ROUTES if row.example != "/")]

    def row_paths(self) -> list[tuple[str, PathTemplate]]:
        """Every row this plane serves as ``(method, template)``, one per path."""
        served = [(endpoint.method, template) for endpoint in self.pipelines.served for template in endpoint.templates]
        return [*served, *((resource.method, resource.path) for resource in self.pipelines.resources)]

    async def __call__(self, request: Request, out: Responder) -> None:
        path = request.path
        try:
            problem = path_problem(request.raw_path)
            if problem is not None:  # before routing: every server on the way must read the path the proxy read
                raise ProxyError(400, f"{problem}: {request.raw_path.partition('?')[0]!r}", code="bad_path")
            await self._resolve(request.method, path)(request, out)
        except ProxyError as exc:
            exc.send(out, _dialect_for(path))

    def _resolve(self, method: str, path: str) -> Handler:
        exact = self._exact.get((method, path))
        if exact is not None:
            return exact
        if path.startswith(RESPONSES_PREFIX):
            return self._resource(method, path)
        if path.startswith("/v1/"):
            if self._passthrough_allowed.allows(method, path):
                return self._llm_passthrough
            allowed = sorted(m for m, p in self._exact if p == path)
            if allowed:
                raise ProxyError(405, "Method Not Allowed", code="method_not_allowed",
                                 headers={"Allow": ",".join(allowed)})
            raise ProxyError(404, f"{method} {path} is not served by this proxy (an operator may forward it: "
                                  "upstreams.llm_passthrough)", code="not_found")
        if path in self._get_only:
            raise ProxyError(405, "Method Not Allowed", code="method_not_allowed", headers={"Allow": "GET,HEAD"})
        return self._qdrant_kinds[route_of(method, path).kind]  # what no row serves: refused here

    def _resource(self, method: str, path: str) -> Handler:
        """The row serving a request under ``/v1/responses/``: its method at a template its path matches; a 405
        when only other methods are served there, else the upstream's own 404 for a URL it does not know."""
        others: list[str] = [m for m, p in self._exact if p == path]
        for resource, served in self._templated:
            if resource.path.match(path) is not None:
                if resource.method == method:
                    return served
                others.append(resource.method)
        if others:
            raise ProxyError(405, "Method Not Allowed", code="method_not_allowed",
                             headers={"Allow": ",".join(sorted(set(others)))})
        raise ProxyError(404, f"Invalid URL ({method} {path})", error_type="invalid_request_error")

    async def _qdrant(self, request: Request, out: Responder) -> None:
        await self._qdrant_kinds[route_of(request.method, request.path).kind](request, out)


def create_server(plane: DataPlane) -> HttpServer:
    """The data plane's server around ``plane``; a client that hangs up cancels its request's handler."""
    server = plane.runtime.settings.server
    return HttpServer(plane, max_body=plane.max_body, error_body=_error_body, read_timeout_s=server.read_timeout_s,
                      head_timeout_s=server.head_timeout_s, body_timeout_s=server.body_timeout_s,
                      max_connections=server.max_connections)
