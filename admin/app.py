"""The admin (control-plane) application: ``create_admin_app(rt)``, served on its own port next to the data plane.

Routes by concern: :mod:`admin.cache_routes` (stats, entries, invalidation, versions, flush, LiteLLM
``/cache/*``), :mod:`admin.credit_routes` (keys, balances, ledger), :mod:`admin.limit_routes` (rate limits,
budgets and key lifetimes), :mod:`admin.system_routes` (config, backends, ``/metrics``, OpenAPI, dashboard).
Auth in :mod:`admin.auth`; errors in :mod:`admin.errors`; every route is described in :mod:`admin.openapi`. The
admin app shares the data plane's :class:`Runtime` but neither starts nor stops it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from admin import cache_routes, credit_routes, limit_routes, system_routes
from admin.auth import auth_middleware
from admin.errors import json_errors
from admin.state import RUNTIME
from proxy.assembly.runtime import Runtime

MAX_BODY = 4 * 1024 * 1024
DASHBOARD = "/admin/ui"


async def to_dashboard(_: web.Request) -> web.Response:
    """``/``: a browser pointed at the admin port lands on the dashboard."""
    raise web.HTTPFound(DASHBOARD)


def create_admin_app(rt: Runtime) -> web.Application:
    """The admin API over ``rt``."""
    app = web.Application(middlewares=[json_errors, auth_middleware(rt.settings)], client_max_size=MAX_BODY)
    app[RUNTIME] = rt
    sizes: dict[str, dict[str, Any]] = {}
    app[system_routes.TIER_SIZES] = sizes
    system_routes.register_gauges(rt, sizes)
    app.router.add_routes(cache_routes.routes)
    app.router.add_routes(credit_routes.routes)
    app.router.add_routes(limit_routes.routes)
    app.router.add_routes(system_routes.routes)
    app.router.add_get("/", to_dashboard)
    return app
