"""Admin routes over the caches: stats, entries, invalidation, versions, flush, and LiteLLM's ``/cache/*``."""

from __future__ import annotations

import time
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel

from admin import components
from admin.entries import MAX_LIMIT, EntryQuery, decoded_body, list_entries, read_entry, summary
from admin.errors import AdminError
from admin.models import FlushBody, InvalidateBody, KeysDeleteBody, VersionBumpBody
from admin.state import RUNTIME, json_response
from proxy.assembly.runtime import Runtime
from proxy.observability.stats import latency_percentiles
from tiers.invalidation import InvalidSelector, Near, Removal, Selector

routes = web.RouteTableDef()
M = TypeVar("M", bound=BaseModel)


async def body_of(request: web.Request, model: type[M], *, optional: bool = False) -> M:
    """The request's JSON body validated as ``model`` (an empty body is ``{}`` when ``optional``)."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return model.model_validate({})
        raise AdminError(400, "invalid_json", "a JSON object body is expected")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise AdminError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AdminError(400, "invalid_json", "the body must be a JSON object")
    return model.model_validate(data)


def _float(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise AdminError(400, "invalid_parameter", f"{name}: a number is expected") from None
    if not value >= 0 or value == float("inf"):
        raise AdminError(400, "invalid_parameter", f"{name}: a finite number >= 0 is expected")
    return value


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise AdminError(400, "invalid_parameter", f"{name}: an integer is expected") from None
    if not low <= value <= high:
        raise AdminError(400, "invalid_parameter", f"{name}: must be between {low} and {high}")
    return value


def _text(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    return value if value else None


def _outcome(outcome: Removal) -> dict[str, Any]:
    return {"removed": outcome.removed, "total": outcome.total}


async def tier_report(rt: Runtime) -> dict[str, dict[str, Any]]:
    """Per registered tier: its own report, and the requests it served."""
    served = rt.stats.snapshot(top_n=0)["served_by_tier"]
    empty = {"requests": 0, "hits": 0, "cost_saved_s": 0.0}
    return {tier.name: {**await tier.report(), "served": served.get(tier.name, empty)} for tier in rt.tiers}


def latency(rt: Runtime) -> dict[str, dict[str, float | None]]:
    for family in rt.metrics.registry.collect():
        if family.name == "ragproxy_request_duration_seconds":
            return latency_percentiles(family.samples)
    return {}


@routes.get("/admin/stats")
async def stats(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    snapshot = rt.stats.snapshot(top_n=_int(request, "top", 20, 0, 100))
    snapshot["tiers"] = await tier_report(rt)
    snapshot["latency_s"] = latency(rt)
    snapshot["memory"] = rt.ledger.report()
    return json_response(snapshot)


@routes.get("/admin/entries")
async def entries(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    tiers = components.response_tiers(rt)
    query = EntryQuery(tenant=_text(request, "tenant"), namespace=_text(request, "namespace"),
                       model=_text(request, "model"), q=_text(request, "q"), doc=_text(request, "doc"),
                       min_age_s=_float(request, "min_age_s"), max_age_s=_float(request, "max_age_s"),
                       tier=_text(request, "tier"))
    if query.tier is not None and query.tier not in {t.name for t in tiers}:
        raise AdminError(400, "invalid_parameter", f"tier: unknown tier {query.tier!r}")
    try:
        page, cursor = await list_entries(tiers, query, limit=_int(request, "limit", 50, 1, MAX_LIMIT),
                                          cursor=_text(request, "cursor"))
    except ValueError as exc:
        raise AdminError(400, "invalid_parameter", str(exc)) from None
    return json_response({"entries": page, "next_cursor": cursor})


@routes.get("/admin/entries/{key:.+}")
async def entry(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    key = request.match_info["key"]
    found = await read_entry(components.response_tiers(rt), key)
    if found is None:
        raise AdminError(404, "not_found", "no cached entry under this key")
    cached, size, present = found
    return json_response({**summary(key, cached, present, size, time.time()), "meta": cached.meta,
                          "body": decoded_body(cached)})


@routes.delete("/admin/entries/{key:.+}")
async def delete_entry(request: web.Request) -> web.Response:
    outcome = await components.invalidator(request.app[RUNTIME]).delete_keys([request.match_info["key"]])
    if not outcome.keys:
        raise AdminError(404, "not_found", "no cached entry under this key")
    return json_response(_outcome(outcome))


def selector_of(body: InvalidateBody) -> Selector:
    return Selector(keys=tuple(body.keys), tenant=body.tenant, namespace=body.namespace, model=body.model,
                    documents=tuple(body.documents), collection=body.collection,
                    near=Near(body.near.text, body.near.radius) if body.near is not None else None,
                    older_than_s=body.older_than_s, newer_than_s=body.newer_than_s)


@routes.post("/admin/invalidate")
async def invalidate(request: web.Request) -> web.Response:
    selector = selector_of(await body_of(request, InvalidateBody))
    if selector.empty:
        raise AdminError(400, "empty_selector", "name at least one selector (use /admin/flush to empty a tier)")
    try:
        outcome = await components.invalidator(request.app[RUNTIME]).invalidate(selector)
    except InvalidSelector as exc:
        raise AdminError(400, "invalid_selector", str(exc)) from None
    return json_response(_outcome(outcome))


@routes.post("/admin/versions/bump")
async def bump_version(request: web.Request) -> web.Response:
    body = await body_of(request, VersionBumpBody)
    version = await request.app[RUNTIME].versions.bump(body.tenant, body.namespace)
    return json_response({"tenant": body.tenant, "namespace": body.namespace, "version": str(version)})


@routes.post("/admin/flush")
async def flush(request: web.Request) -> web.Response:
    body = await body_of(request, FlushBody, optional=True)
    try:
        outcome = await components.invalidator(request.app[RUNTIME]).flush(body.tiers)
    except InvalidSelector as exc:
        raise AdminError(400, "invalid_parameter", str(exc)) from None
    return json_response(_outcome(outcome))


@routes.post("/cache/delete")
async def litellm_delete(request: web.Request) -> web.Response:
    body = await body_of(request, KeysDeleteBody)
    outcome = await components.invalidator(request.app[RUNTIME]).delete_keys(body.keys)
    return json_response({"status": "success", "deleted": len(outcome.keys), "removed": outcome.removed})


@routes.post("/cache/flushall")
async def litellm_flushall(request: web.Request) -> web.Response:
    outcome = await components.invalidator(request.app[RUNTIME]).flush(None)
    return json_response({"status": "success", "removed": outcome.removed})


@routes.get("/cache/ping")
async def litellm_ping(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return json_response({"status": "healthy", "cache_type": "ragproxy", "tiers": [t.name for t in rt.tiers],
                          "off": {off.name: off.reason for off in rt.tiers.off}, "ping_response": True})
