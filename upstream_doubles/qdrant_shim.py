"""QdrantShim: a TEST-ONLY Qdrant REST server over qdrant-client's local mode (``QdrantClient(":memory:")``).

Not a Qdrant: it exists so that tests and benchmarks can put an HTTP Qdrant behind the proxy without a Qdrant
binary. Semantics (filters, scoring, payload ops) are local mode's; this module only translates REST to the
local client's methods, parsing bodies with qdrant-client's own pydantic models
(``qdrant_client.http.models``) and answering in Qdrant's envelope ``{"result": ..., "status": "ok", "time":
seconds}``. Errors answer ``{"status": {"error": "..."}, "time": ...}``: 404 for a missing collection, 400 for
a bad body (409 is not used: Qdrant answers 400 for an existing collection too).

Routes: ``GET /``, ``/healthz``, ``/readyz``, ``/livez``, ``/cluster``, ``/telemetry``, ``/collections``,
``/aliases``; ``POST /collections/aliases`` (create, delete and rename actions);
``GET/PUT/DELETE /collections/{name}``, ``GET .../exists``, ``GET .../aliases``, ``PUT .../index`` and ``DELETE
.../index/{field}`` (payload indexes: accepted, no effect in local mode); under ``/collections/{name}/points``:
``PUT`` (upsert), ``POST`` (retrieve), ``GET /{id}``, ``POST`` ``delete``, ``search``, ``search/batch``,
``recommend``, ``recommend/batch``, ``query``, ``query/batch``, ``query/groups``, ``scroll``, ``count``,
``payload`` (POST set, PUT overwrite), ``payload/delete``, ``payload/clear``. Search and recommend (removed from
qdrant-client 1.x's own API but still served by Qdrant and sent by older clients) are translated to
``query_points``.

Process: ``python -m upstream_doubles.qdrant_shim --port 6333``. Every request is logged in ``log``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import socket
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError
from qdrant_client import QdrantClient
from qdrant_client.http import models

from proxy.core.loopback import LOOPBACK
from upstream_doubles.served_app import ServedApp

VERSION = importlib.metadata.version("qdrant-client")  # what the installed client expects of a server

Result = Any
Route = Callable[["QdrantShim", web.Request, Any], Result]


class ShimError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def jsonable(value: Any) -> Any:
    """Results of the local client as JSON-ready values (pydantic models dumped in JSON mode)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


_FILTER = TypeAdapter(models.Filter | None)
_PARAMS = TypeAdapter(models.SearchParams | None)
_WITH_PAYLOAD = TypeAdapter(models.WithPayloadInterface)
_WITH_VECTOR = TypeAdapter(models.WithVector)
_SELECTOR = TypeAdapter(models.PointsSelector)
_INSERT = TypeAdapter(models.PointInsertOperations)
_IDS = TypeAdapter(list[models.ExtendedPointId])
_LOOKUP = TypeAdapter(models.LookupLocation | None)
_STRATEGY = TypeAdapter(models.RecommendStrategy | None)


def _selector(body: dict[str, Any]) -> models.PointsSelector:
    """``points`` (ids) or ``filter`` of a payload operation body, as a selector."""
    if body.get("points") is not None:
        return models.PointIdsList(points=_IDS.validate_python(body["points"]))
    if body.get("filter") is not None:
        return models.FilterSelector(filter=models.Filter.model_validate(body["filter"]))
    raise ShimError(400, "Bad request: either `points` or `filter` is required")


class QdrantShim(ServedApp):
    """TEST-ONLY Qdrant REST shim. ``client`` defaults to a fresh ``QdrantClient(":memory:")``."""

    def __init__(self, client: QdrantClient | None = None, *, host: str = LOOPBACK, port: int = 0,
                 sock: socket.socket | None = None) -> None:
        super().__init__(host=host, port=port, sock=sock)
        self.client = client if client is not None else QdrantClient(":memory:")

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(
            "/",
            self._plain(
                lambda: {
                    "title": "qdrant - vector search engine (test shim)",
                    "version": VERSION,
                    "commit": None,
                }
            ),
        )
        r.add_get("/healthz", self._text("healthz check passed"))
        r.add_get("/livez", self._text("healthz check passed"))
        r.add_get("/readyz", self._text("all shards are ready"))
        c = "/collections/{name}"
        p = c + "/points"
        table: list[tuple[str, str, Route, bool]] = [
            ("GET", "/cluster", QdrantShim._cluster, False),
            ("GET", "/telemetry", QdrantShim._telemetry, False),
            ("GET", "/collections", QdrantShim._collections, False),
            ("GET", "/aliases", QdrantShim._aliases, False),
            ("POST", "/collections/aliases", QdrantShim._update_aliases, False),
            ("GET", c + "/aliases", QdrantShim._collection_aliases, True),
            ("GET", c + "/exists", QdrantShim._exists, False),
            ("PUT", c, QdrantShim._create, False),
            ("GET", c, QdrantShim._info, True),
            ("DELETE", c, QdrantShim._delete_collection, False),
            ("PUT", c + "/index", QdrantShim._create_index, True),
            ("DELETE", c + "/index/{field}", QdrantShim._delete_index, True),
            ("PUT", p, QdrantShim._upsert, True),
            ("POST", p, QdrantShim._retrieve, True),
            ("POST", p + "/delete", QdrantShim._delete_points, True),
            ("POST", p + "/search", QdrantShim._search, True),
            ("POST", p + "/search/batch", QdrantShim._search_batch, True),
            ("POST", p + "/recommend", QdrantShim._recommend, True),
            ("POST", p + "/recommend/batch", QdrantShim._recommend_batch, True),
            ("POST", p + "/query", QdrantShim._query, True),
            ("POST", p + "/query/batch", QdrantShim._query_batch, True),
            ("POST", p + "/query/groups", QdrantShim._query_groups, True),
            ("POST", p + "/scroll", QdrantShim._scroll, True),
            ("POST", p + "/count", QdrantShim._count, True),
            ("POST", p + "/payload", QdrantShim._set_payload, True),
            ("PUT", p + "/payload", QdrantShim._overwrite_payload, True),
            ("POST", p + "/payload/delete", QdrantShim._delete_payload, True),
            ("POST", p + "/payload/clear", QdrantShim._clear_payload, True),
            ("GET", p + "/{id}", QdrantShim._get_point, True),
        ]
        for method, path, route, needs_collection in table:
            r.add_route(method, path, self._endpoint(route, needs_collection))
        r.add_route("*", "/{tail:.*}", self._unknown)

    # -- plumbing --------------------------------------------------------------------------------------------
    def _endpoint(
        self, route: Route, needs_collection: bool
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                raw = await request.read()
                body = orjson.loads(raw) if raw else {}
                name = request.match_info.get("name")
                if needs_collection and name is not None and not self.client.collection_exists(name):
                    raise ShimError(404, f"Not found: Collection `{name}` doesn't exist!")
                result = jsonable(route(self, request, body))
            except ShimError as error:
                return _error(error.status, error.message, started)
            except orjson.JSONDecodeError as error:
                return _error(400, f"Format error in JSON body: {error}", started)
            except (ValidationError, ValueError, TypeError, KeyError, AttributeError, AssertionError) as error:
                return _error(400, f"Bad request: {error}", started)
            return _ok(result, started)

        return handle

    @staticmethod
    def _plain(make: Callable[[], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(body=orjson.dumps(make()), content_type="application/json")

        return handle

    @staticmethod
    def _text(text: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(text=text)

        return handle

    async def _unknown(self, request: web.Request) -> web.Response:
        return _error(404, f"Not found: {request.method} {request.path}", time.perf_counter())

    # -- service and collections -----------------------------------------------------------------------------
    def _cluster(self, request: web.Request, body: Any) -> Result:
        return {"status": "disabled"}

    def _telemetry(self, request: web.Request, body: Any) -> Result:
        return {
            "id": "qdrant-shim",
            "app": {"name": "qdrant", "version": VERSION, "startup": datetime.now(UTC).isoformat()},
            "collections": {"number_of_collections": len(self.client.get_collections().collections)},
        }

    def _collections(self, request: web.Request, body: Any) -> Result:
        return self.client.get_collections()

    def _aliases(self, request: web.Request, body: Any) -> Result:
        return self.client.get_aliases()

    def _collection_aliases(self, request: web.Request, body: Any) -> Result:
        return self.client.get_collection_aliases(request.match_info["name"])

    def _update_aliases(self, request: web.Request, body: Any) -> Result:
        operations = models.ChangeAliasesOperation.model_validate(body)
        for action in operations.actions:
            created = getattr(action, "create_alias", None)
            if created is not None and not self.client.collection_exists(created.collection_name):
                raise ShimError(404, f"Not found: Collection `{created.collection_name}` doesn't exist!")
        return self.client.update_collection_aliases(change_aliases_operations=operations.actions)

    def _exists(self, request: web.Request, body: Any) -> Result:
        return models.CollectionExistence(exists=self.client.collection_exists(request.match_info["name"]))

    def _create(self, request: web.Request, body: Any) -> Result:
        name = request.match_info["name"]
        spec = models.CreateCollection.model_validate(body)
        if self.client.collection_exists(name):
            raise ShimError(400, f"Wrong input: Collection `{name}` already exists!")
        return self.client.create_collection(
            name,
            vectors_config=spec.vectors,
            sparse_vectors_config=spec.sparse_vectors,
            metadata=spec.metadata,
        )

    def _info(self, request: web.Request, body: Any) -> Result:
        return self.client.get_collection(request.match_info["name"])

    def _delete_collection(self, request: web.Request, body: Any) -> Result:
        return self.client.delete_collection(request.match_info["name"])

    def _create_index(self, request: web.Request, body: Any) -> Result:
        spec = models.CreateFieldIndex.model_validate(body)
        with warnings.catch_warnings():  # "payload indexes have no effect in local mode": known, by design
            warnings.simplefilter("ignore", UserWarning)
            return self.client.create_payload_index(
                request.match_info["name"], field_name=spec.field_name, field_schema=spec.field_schema
            )

    def _delete_index(self, request: web.Request, body: Any) -> Result:
        with warnings.catch_warnings():  # as in _create_index
            warnings.simplefilter("ignore", UserWarning)
            return self.client.delete_payload_index(
                request.match_info["name"], field_name=request.match_info["field"]
            )

    # -- points ----------------------------------------------------------------------------------------------
    def _upsert(self, request: web.Request, body: Any) -> Result:
        operation = _INSERT.validate_python(body)
        points: Any = operation.points if isinstance(operation, models.PointsList) else operation.batch
        return self.client.upsert(
            request.match_info["name"], points=points, update_filter=operation.update_filter
        )

    def _retrieve(self, request: web.Request, body: Any) -> Result:
        spec = models.PointRequest.model_validate(body)
        return self.client.retrieve(
            request.match_info["name"],
            ids=spec.ids,
            with_payload=spec.with_payload if spec.with_payload is not None else True,
            with_vectors=spec.with_vector if spec.with_vector is not None else False,
        )

    def _get_point(self, request: web.Request, body: Any) -> Result:
        raw = request.match_info["id"]
        point_id: models.ExtendedPointId = int(raw) if raw.isdigit() else raw
        found = self.client.retrieve(request.match_info["name"], ids=[point_id], with_vectors=True)
        if not found:
            raise ShimError(404, f"Not found: No point with id {raw} found")
        return found[0]

    def _delete_points(self, request: web.Request, body: Any) -> Result:
        selector = _SELECTOR.validate_python(body)
        return self.client.delete(request.match_info["name"], points_selector=selector)

    def _count(self, request: web.Request, body: Any) -> Result:
        spec = models.CountRequest.model_validate(body)
        return self.client.count(
            request.match_info["name"], count_filter=spec.filter, exact=spec.exact is not False
        )

    def _scroll(self, request: web.Request, body: Any) -> Result:
        spec = models.ScrollRequest.model_validate(body)
        points, next_offset = self.client.scroll(
            request.match_info["name"],
            scroll_filter=spec.filter,
            limit=spec.limit if spec.limit is not None else 10,
            order_by=spec.order_by,
            offset=spec.offset,
            with_payload=spec.with_payload if spec.with_payload is not None else True,
            with_vectors=spec.with_vector if spec.with_vector is not None else False,
        )
        return models.ScrollResult(points=points, next_page_offset=next_offset)

    # -- search ----------------------------------------------------------------------------------------------
    def _query_one(self, name: str, spec: models.QueryRequest) -> models.QueryResponse:
        return self.client.query_points(
            name,
            query=spec.query,
            using=spec.using,
            prefetch=spec.prefetch,
            query_filter=spec.filter,
            search_params=spec.params,
            limit=spec.limit if spec.limit is not None else 10,
            offset=spec.offset,
            with_payload=spec.with_payload if spec.with_payload is not None else False,
            with_vectors=spec.with_vector if spec.with_vector is not None else False,
            score_threshold=spec.score_threshold,
            lookup_from=spec.lookup_from,
        )

    def _query(self, request: web.Request, body: Any) -> Result:
        return self._query_one(request.match_info["name"], models.QueryRequest.model_validate(body))

    def _query_batch(self, request: web.Request, body: Any) -> Result:
        batch = models.QueryRequestBatch.model_validate(body)
        return [self._query_one(request.match_info["name"], spec) for spec in batch.searches]

    def _query_groups(self, request: web.Request, body: Any) -> Result:
        spec = models.QueryGroupsRequest.model_validate(body)
        return self.client.query_points_groups(
            request.match_info["name"],
            group_by=spec.group_by,
            query=spec.query,
            using=spec.using,
            prefetch=spec.prefetch,
            query_filter=spec.filter,
            search_params=spec.params,
            limit=spec.limit if spec.limit is not None else 10,
            group_size=spec.group_size if spec.group_size is not None else 3,
            with_payload=spec.with_payload if spec.with_payload is not None else False,
            with_vectors=spec.with_vector if spec.with_vector is not None else False,
            score_threshold=spec.score_threshold,
            with_lookup=spec.with_lookup,
            lookup_from=spec.lookup_from,
        )

    def _search_one(self, name: str, body: dict[str, Any]) -> list[models.ScoredPoint]:
        """A legacy ``SearchRequest`` as ``query_points`` (dense, named or sparse ``vector``)."""
        vector = body.get("vector")
        using: str | None = None
        if isinstance(vector, dict):
            using = vector.get("name")
            vector = vector.get("vector")
        query: Any = models.SparseVector.model_validate(vector) if isinstance(vector, dict) else vector
        if not isinstance(query, (list, models.SparseVector)):
            raise ShimError(400, "Bad request: `vector` is required")
        return self._scored(name, body, query, using)

    def _scored(
        self, name: str, body: dict[str, Any], query: Any, using: str | None
    ) -> list[models.ScoredPoint]:
        return self.client.query_points(
            name,
            query=query,
            using=using,
            query_filter=_FILTER.validate_python(body.get("filter")),
            search_params=_PARAMS.validate_python(body.get("params")),
            limit=int(body.get("limit", 10)),
            offset=body.get("offset"),
            with_payload=_WITH_PAYLOAD.validate_python(body.get("with_payload", False)),
            with_vectors=_WITH_VECTOR.validate_python(body.get("with_vector", False)),
            score_threshold=body.get("score_threshold"),
            lookup_from=_LOOKUP.validate_python(body.get("lookup_from")),
        ).points

    def _search(self, request: web.Request, body: Any) -> Result:
        return self._search_one(request.match_info["name"], body)

    def _search_batch(self, request: web.Request, body: Any) -> Result:
        return [self._search_one(request.match_info["name"], spec) for spec in body["searches"]]

    def _recommend_one(self, name: str, body: dict[str, Any]) -> list[models.ScoredPoint]:
        query = models.RecommendQuery(
            recommend=models.RecommendInput(
                positive=body.get("positive"),
                negative=body.get("negative"),
                strategy=_STRATEGY.validate_python(body.get("strategy")),
            )
        )
        return self._scored(name, body, query, body.get("using"))

    def _recommend(self, request: web.Request, body: Any) -> Result:
        return self._recommend_one(request.match_info["name"], body)

    def _recommend_batch(self, request: web.Request, body: Any) -> Result:
        return [self._recommend_one(request.match_info["name"], spec) for spec in body["searches"]]

    # -- payload ---------------------------------------------------------------------------------------------
    def _set_payload(self, request: web.Request, body: Any) -> Result:
        spec = models.SetPayload.model_validate(body)
        return self.client.set_payload(
            request.match_info["name"], payload=spec.payload, points=_selector(body), key=spec.key
        )

    def _overwrite_payload(self, request: web.Request, body: Any) -> Result:
        spec = models.SetPayload.model_validate(body)
        return self.client.overwrite_payload(
            request.match_info["name"], payload=spec.payload, points=_selector(body)
        )

    def _delete_payload(self, request: web.Request, body: Any) -> Result:
        spec = models.DeletePayload.model_validate(body)
        return self.client.delete_payload(request.match_info["name"], keys=spec.keys, points=_selector(body))

    def _clear_payload(self, request: web.Request, body: Any) -> Result:
        return self.client.clear_payload(
            request.match_info["name"], points_selector=_SELECTOR.validate_python(body)
        )


def _ok(result: Any, started: float) -> web.Response:
    """Qdrant's envelope around ``result``; a value JSON cannot hold (a set, an object) goes out as its text rather
    than failing the encoder."""
    envelope = {"result": result, "status": "ok", "time": time.perf_counter() - started}
    return web.Response(body=orjson.dumps(envelope, default=str), content_type="application/json")


def _error(status: int, message: str, started: float) -> web.Response:
    body = {"status": {"error": message}, "time": time.perf_counter() - started}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m upstream_doubles.qdrant_shim",
        description="TEST-ONLY Qdrant REST shim over qdrant-client local mode",
    )
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    QdrantShim(host=args.host, port=args.port).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
