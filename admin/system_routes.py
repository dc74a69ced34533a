"""Admin routes about the process: effective config (read, patch), backends, ``/metrics``, the OpenAPI document
and the dashboard page."""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from admin import components
from admin.cache_routes import tier_report
from admin.config_patch import PatchRejected, patched
from admin.errors import AdminError
from admin.openapi import openapi_document
from admin.state import RUNTIME, json_response
from proxy.assembly.config import redacted
from proxy.assembly.live_settings import LIVE_KEYS
from proxy.assembly.runtime import Runtime
from proxy.upstream.settings import redact_url

routes = web.RouteTableDef()
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@routes.get("/admin/config")
async def get_config(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return json_response({"config": redacted(rt.settings), "patchable": list(LIVE_KEYS)})


@routes.patch("/admin/config")
async def patch_config(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    raw = await request.read()
    try:
        patch = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError as exc:
        raise AdminError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(patch, dict):
        raise AdminError(400, "invalid_json", "the body must be a JSON object of settings")
    try:
        settings, changes = patched(rt.settings, patch)
    except PatchRejected as exc:
        raise AdminError(400, "invalid_config", str(exc)) from None
    rt.configure(settings, changes)
    return json_response({"changed": changes, "config": redacted(settings), "patchable": list(LIVE_KEYS)})


def _breaker_state(backend: Any) -> str:
    state = getattr(getattr(backend, "breaker", None), "state", "closed")
    return str(getattr(state, "value", state))


def backends_report(rt: Runtime) -> list[dict[str, Any]]:
    return [{"name": b.label, "url": redact_url(b.url), "kind": b.config.kind, "healthy": b.healthy,
             "in_flight": b.in_flight, "max_concurrency": b.config.max_concurrency, "last_error": b.last_error,
             "breaker": _breaker_state(b)}
            for b in rt.backends.backends]


@routes.get("/admin/backends")
async def backends(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return json_response({"backends": backends_report(rt), "knowledge_tree": components.knowledge_summary(rt)})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    request.app[TIER_SIZES].clear()
    request.app[TIER_SIZES].update(await tier_report(rt))
    return web.Response(body=rt.metrics.exposition(), headers={"Content-Type": PROMETHEUS_TEXT})


@routes.get("/admin/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return json_response(openapi_document())


@routes.get("/admin/ui")
async def dashboard(request: web.Request) -> web.Response:
    page = resources.files("admin").joinpath("dashboard.html").read_bytes()
    return web.Response(body=page, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                                 "X-Frame-Options": "DENY",  # for browsers without CSP frame-ancestors
                                 "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                 "script-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"})


TIER_SIZES = web.AppKey("tier_sizes", dict)


def register_gauges(rt: Runtime, sizes: dict[str, dict[str, Any]]) -> None:
    """Gauges read at scrape time: tier sizes (refreshed by the ``/metrics`` handler) and backend state."""
    rt.metrics.gauge_callback("ragproxy_cache_entries", "Entries held per tier", ["tier"],
                              lambda: [({"tier": name}, float(t.get("entries", 0))) for name, t in sizes.items()
                                       if "entries" in t])
    rt.metrics.gauge_callback("ragproxy_cache_size_bytes", "Bytes held per tier", ["tier"],
                              lambda: [({"tier": name}, float(t.get("bytes", 0))) for name, t in sizes.items()
                                       if "bytes" in t])
    rt.metrics.gauge_callback("ragproxy_backend_up", "1 when the replica is considered healthy", ["backend"],
                              lambda: [({"backend": b.label}, 1.0 if b.healthy else 0.0)
                                       for b in rt.backends.backends])
    rt.metrics.gauge_callback("ragproxy_backend_in_flight", "Requests in flight per replica", ["backend"],
                              lambda: [({"backend": b.label}, float(b.in_flight)) for b in rt.backends.backends])
    for tier in rt.tiers:
        for gauge in tier.gauges():
            rt.metrics.gauge_callback(gauge.name, gauge.text, gauge.labels, gauge.read)
    rt.metrics.gauge_callback("ragproxy_memory_bytes", "Bytes each structure users name or fill holds (the memory "
                              "ledger of /admin/stats)", ["structure"],
                              lambda: [({"structure": a.name}, float(a.bytes)) for a in rt.ledger.accounts()])
    rt.metrics.gauge_callback("ragproxy_memory_budget_bytes", "The byte budget each such structure keeps within",
                              ["structure"],
                              lambda: [({"structure": a.name}, float(a.budget)) for a in rt.ledger.accounts()])
    rt.metrics.gauge_callback("ragproxy_coalesced_requests", "Requests answered by another request's upstream "
                              "call since start", [], lambda: [({}, float(rt.stats.coalesced))])
