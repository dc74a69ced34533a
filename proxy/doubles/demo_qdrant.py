"""DemoQdrant: the TEST Qdrant of ``ragproxy demo``, a few Qdrant REST routes over qdrant-client's local mode.

Not a Qdrant server: ``QdrantClient(":memory:")`` does the storing and scoring; this module only translates the
routes a first try needs, parsing bodies with qdrant-client's own models and answering in Qdrant's envelope
(``{"result": ..., "status": "ok", "time": s}``; errors ``{"status": {"error": "..."}, "time": s}``).
Routes: ``GET /``, ``GET``/``PUT /collections/{name}``, ``PUT /collections/{name}/points`` (upsert), ``POST
/collections/{name}/points/query`` and ``/points/search`` (a dense ``vector`` only).
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError
from qdrant_client import QdrantClient
from qdrant_client.http import models

_INSERT: TypeAdapter[models.PointInsertOperations] = TypeAdapter(models.PointInsertOperations)
Route = Callable[[str, Any], Any]


def _jsonable(value: Any) -> Any:
    """What orjson cannot encode: qdrant-client's models as their JSON form, anything else as its text."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else str(value)


def _envelope(status: int, payload: dict[str, Any], started: float) -> web.Response:
    body = orjson.dumps({**payload, "time": time.perf_counter() - started}, default=_jsonable)
    return web.Response(status=status, body=body, content_type="application/json")


class DemoQdrant:
    """The aiohttp app (:attr:`app`) over one in-memory local-mode client; :attr:`calls` counts the searches it
    answered."""

    def __init__(self) -> None:
        self.calls = 0
        self.client = QdrantClient(":memory:")
        self.app = web.Application()
        self.app.router.add_get("/", self._root)
        routes: dict[tuple[str, str], Route] = {
            ("GET", "/collections/{name}"): lambda name, _: self.client.get_collection(name),
            ("PUT", "/collections/{name}"): self._create,
            ("PUT", "/collections/{name}/points"): self._upsert,
            ("POST", "/collections/{name}/points/query"): self._query,
            ("POST", "/collections/{name}/points/search"): self._search,
        }
        for (method, path), route in routes.items():
            self.app.router.add_route(method, path, self._handler(route))
        self.app.router.add_route("*", "/{tail:.*}", self._not_found)

    async def _root(self, _: web.Request) -> web.Response:
        return web.json_response({"title": "ragproxy demo Qdrant (qdrant-client local mode)",
                                  "version": importlib.metadata.version("qdrant-client")})

    async def _not_found(self, request: web.Request) -> web.Response:
        return _envelope(404, {"status": {"error": f"{request.path} is not served by the demo Qdrant"}},
                         time.perf_counter())

    @staticmethod
    def _handler(route: Route) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                body = orjson.loads(await request.read()) if request.can_read_body else None
                result = route(request.match_info["name"], body)
            except (orjson.JSONDecodeError, ValidationError, ValueError) as exc:
                status = 404 if "not found" in str(exc).lower() else 400
                return _envelope(status, {"status": {"error": str(exc).splitlines()[0]}}, started)
            return _envelope(200, {"result": result, "status": "ok"}, started)

        return handle

    def _create(self, name: str, body: Any) -> bool:
        spec = models.CreateCollection.model_validate(body)
        return self.client.create_collection(name, vectors_config=spec.vectors)

    def _upsert(self, name: str, body: Any) -> models.UpdateResult:
        operation = _INSERT.validate_python(body)
        points: Any = operation.points if isinstance(operation, models.PointsList) else operation.batch
        return self.client.upsert(name, points=points)

    def _query(self, name: str, body: Any) -> models.QueryResponse:
        return self._nearest(name, models.QueryRequest.model_validate(body))

    def _search(self, name: str, body: Any) -> list[models.ScoredPoint]:
        if not isinstance(body, dict) or not isinstance(body.get("vector"), list):
            raise ValueError("Bad request: a dense `vector` is required")
        rest = {key: value for key, value in body.items() if key != "vector"}
        spec = models.QueryRequest.model_validate({**rest, "query": body["vector"]})
        return self._nearest(name, spec).points

    def _nearest(self, name: str, spec: models.QueryRequest) -> models.QueryResponse:
        self.calls += 1
        return self.client.query_points(
            name, query=spec.query, query_filter=spec.filter, limit=spec.limit or 10, offset=spec.offset,
            with_payload=spec.with_payload or False, with_vectors=spec.with_vector or False,
            score_threshold=spec.score_threshold)
