"""Admin routes over rate limits, budgets and key lifetimes (live when the proxy has API keys).

``GET``/``PATCH /admin/keys/{key_id}``: a key, its limits, expiry and usage; ``GET``/``PUT``/``PATCH
/admin/users/{user}`` and ``/admin/tenants/{tenant}``: a user's or tenant's limits and usage; ``GET /admin/limits``:
every active key and every limited user and tenant with their usage now, and the requests refused so far (what the
dashboard shows). In a ``PATCH`` an absent field stays as it is and ``null`` removes it; a ``PUT`` sets all of them.
Budgets are in credits, so they need ``credits.enabled``; a budget period needs a budget. A change reaches every
replica within ``auth.key_sync_s`` (the key store's change feed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from admin import components
from admin.cache_routes import body_of
from admin.errors import AdminError
from admin.limit_views import edited, key_view, limits_view
from admin.models import KeyPatchBody, LimitsBody
from admin.state import RUNTIME, json_response
from proxy.assembly.runtime import Runtime
from proxy.auth.keys import ApiKey, KeyStore
from proxy.core.handoffs import Scope
from proxy.credits.pricing import format_credits
from proxy.rate_limits.counters import LimitCounters
from proxy.rate_limits.decisions import budget_window, duration_seconds

routes = web.RouteTableDef()
KEYS_SHOWN = 200
NAME_LENGTH = 200


def _parts(request: web.Request) -> tuple[Runtime, KeyStore, LimitCounters]:
    rt = request.app[RUNTIME]
    keys, counters = components.key_store(rt), rt.credits.counters
    if keys is None or counters is None:
        raise AdminError(404, "credits_not_enabled", "API keys are not enabled on this proxy")
    return rt, keys, counters


def _name(request: web.Request, part: str) -> str:
    name = request.match_info[part]
    if not 1 <= len(name) <= NAME_LENGTH:
        raise AdminError(400, "invalid_parameter", f"{part}: 1 to {NAME_LENGTH} characters")
    return name


def _refused(exc: ValueError) -> AdminError:
    return AdminError(400, "invalid_limits", str(exc))


async def usage_view(counters: LimitCounters, scope: Scope, now: float) -> dict[str, Any]:
    """What ``scope`` used now: its buckets' levels, and its budget window's spend."""
    limits = scope.limits
    level = await counters.level(scope, now) if limits.rpm_limit or limits.tpm_limit else None
    spent: int | None = None
    resets: float | None = None
    if limits.max_budget is not None:
        window = budget_window(limits.budget_duration, now)
        spent = await counters.spent(scope, window)
        resets = window.end if window.end != float("inf") else None
    return {"requests": None if level is None or limits.rpm_limit is None else round(level.requests, 3),
            "tokens": None if level is None or limits.tpm_limit is None else round(level.tokens, 3),
            "budget_spent": None if spent is None else format_credits(spent), "budget_resets_at": resets}


async def _key_with_usage(counters: LimitCounters, key: ApiKey, now: float) -> dict[str, Any]:
    usage = await usage_view(counters, Scope("key", key.key_id, key.limits), now) if key.limits.limited else None
    return {**key_view(key), "usage": usage}


async def _scope_view(counters: LimitCounters, scope: Scope) -> dict[str, Any]:
    usage = await usage_view(counters, scope, time.time()) if scope.limits.limited else None
    return {"kind": scope.kind, "name": scope.name, "limits": limits_view(scope.limits), "usage": usage}


@routes.get("/admin/keys/{key_id}")
async def get_key(request: web.Request) -> web.Response:
    _, keys, counters = _parts(request)
    key = await keys.get(request.match_info["key_id"])
    if key is None:
        raise AdminError(404, "not_found", "no key with this id")
    return json_response(await _key_with_usage(counters, key, time.time()))


@routes.patch("/admin/keys/{key_id}")
async def patch_key(request: web.Request) -> web.Response:
    rt, keys, counters = _parts(request)
    body = await body_of(request, KeyPatchBody)
    given = body.model_fields_set
    if "expires_at" in given and "duration" in given:
        raise AdminError(400, "invalid_request", "expires_at or duration, not both")
    now = time.time()
    credits = components.credit_store(rt) is not None

    def edit(key: ApiKey) -> ApiKey:
        expires_at = key.expires_at
        if "expires_at" in given:
            expires_at = body.expires_at
        elif "duration" in given:
            expires_at = None if body.duration is None else now + duration_seconds(body.duration, now)
        name = key.name if "name" not in given else body.name or ""
        return replace(key, name=name, expires_at=expires_at,
                       limits=edited(key.limits, body, whole=False, credits=credits))

    try:
        key = await keys.update(request.match_info["key_id"], edit)
    except ValueError as exc:
        raise _refused(exc) from None
    if key is None:
        raise AdminError(404, "not_found", "no active key with this id")
    rt.credits.known_keys.key_changed(key)  # at once here; within auth.key_sync_s on the other replicas
    return json_response(await _key_with_usage(counters, key, now))


def _scope_routes(kind: str) -> None:
    """``GET``/``PUT``/``PATCH /admin/{kind}s/{name}``."""
    path = f"/admin/{kind}s/{{name}}"

    async def show(request: web.Request) -> web.Response:
        _, keys, counters = _parts(request)
        name = _name(request, "name")
        return json_response(await _scope_view(counters, Scope(kind, name, await keys.scope_limits(kind, name))))

    def change(whole: bool) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            rt, keys, counters = _parts(request)
            name = _name(request, "name")
            body = await body_of(request, LimitsBody)
            credits = components.credit_store(rt) is not None
            try:
                limits = await keys.set_scope_limits(
                    kind, name, lambda current: edited(current, body, whole=whole, credits=credits))
            except ValueError as exc:
                raise _refused(exc) from None
            rt.credits.known_keys.scope_changed(Scope(kind, name, limits))
            return json_response(await _scope_view(counters, Scope(kind, name, limits)))

        return handler

    routes.get(path)(show)
    routes.put(path)(change(whole=True))
    routes.patch(path)(change(whole=False))


_scope_routes("user")
_scope_routes("tenant")


@routes.get("/admin/limits")
async def all_limits(request: web.Request) -> web.Response:
    rt, keys, counters = _parts(request)
    now = time.time()
    active = await keys.list()  # not revoked (expired ones too: they say so)
    shown = active[:KEYS_SHOWN]
    scopes = await keys.limited_scopes()
    key_views, scope_views = await asyncio.gather(
        asyncio.gather(*(_key_with_usage(counters, key, now) for key in shown)),
        asyncio.gather(*(_scope_view(counters, scope) for scope in scopes)))
    return json_response({"keys": key_views, "truncated": len(active) > KEYS_SHOWN,
                          "users": [view for view in scope_views if view["kind"] == "user"],
                          "tenants": [view for view in scope_views if view["kind"] == "tenant"],
                          "refused": dict(rt.credits.limits_refused)})
