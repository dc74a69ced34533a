"""Admin routes over API keys, credit balances and the ledger — live when the runtime has a credit store.

Without one (``rt.credits`` absent) every route here answers 404 with code ``credits_not_enabled``. Amounts are
shown both as integer micro-credits (``*_micro``) and as decimal credit strings.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from admin import components
from admin.cache_routes import _float, _int, _text, body_of
from admin.errors import AdminError
from admin.limit_views import edited, key_view
from admin.models import KeyCreateBody, TopUpBody
from admin.state import RUNTIME, json_response
from proxy.auth.keys import KeyStore
from proxy.core.handoffs import Limits
from proxy.credits.pricing import format_credits, to_micro
from proxy.credits.store import Account, CreditStore, LedgerFilter, export_ledger_csv
from proxy.rate_limits.decisions import duration_seconds

routes = web.RouteTableDef()
BALANCES_LIMIT = 200


def _store(request: web.Request) -> CreditStore:
    store = components.credit_store(request.app[RUNTIME])
    if store is None:
        raise AdminError(404, "credits_not_enabled", "credits are not enabled on this proxy")
    return store


def _keys(request: web.Request) -> KeyStore:
    keys = components.key_store(request.app[RUNTIME])
    if keys is None:
        raise AdminError(404, "credits_not_enabled", "API keys are not enabled on this proxy")
    return keys


def _account(account: Account) -> dict[str, Any]:
    return {"user": account.user, "tenant": account.tenant, "available_micro": account.available,
            "held_micro": account.held, "available": format_credits(account.available),
            "held": format_credits(account.held), "balance": format_credits(account.balance)}


@routes.get("/admin/keys")
async def list_keys(request: web.Request) -> web.Response:
    revoked = request.query.get("include_revoked", "false")
    if revoked not in ("true", "false"):
        raise AdminError(400, "invalid_parameter", "include_revoked: true or false")
    keys = await _keys(request).list(user=_text(request, "user"), tenant=_text(request, "tenant"),
                                      include_revoked=revoked == "true")
    return json_response({"keys": [key_view(k) for k in keys]})


@routes.post("/admin/keys")
async def create_key(request: web.Request) -> web.Response:
    keys = _keys(request)
    body = await body_of(request, KeyCreateBody)
    now = time.time()
    if body.expires_at is not None and body.duration is not None:
        raise AdminError(400, "invalid_request", "expires_at or duration, not both")
    expires_at = body.expires_at if body.duration is None else now + duration_seconds(body.duration, now)
    if expires_at is not None and expires_at <= now:
        raise AdminError(400, "invalid_request", "expires_at is in the past")
    credits = components.credit_store(request.app[RUNTIME]) is not None
    try:
        limits = edited(Limits(), body, whole=True, credits=credits)
    except ValueError as exc:
        raise AdminError(400, "invalid_limits", str(exc)) from None
    created = await keys.create(body.user, body.tenant, body.name, expires_at=expires_at, limits=limits)
    return json_response({**key_view(created.record), "key": created.plaintext}, status=201)


@routes.delete("/admin/keys/{key_id}")
async def revoke_key(request: web.Request) -> web.Response:
    keys = _keys(request)
    if not await keys.revoke(request.match_info["key_id"]):
        raise AdminError(404, "not_found", "no active key with this id")
    revoked = await keys.get(request.match_info["key_id"])
    if revoked is not None:  # refused here at once; within auth.key_sync_s on the other replicas
        request.app[RUNTIME].credits.known_keys.key_changed(revoked)
    return json_response({"revoked": request.match_info["key_id"]})


@routes.get("/admin/credits")
async def balances(request: web.Request) -> web.Response:
    """Balances of every user holding a key (the store has no account listing of its own)."""
    store = _store(request)
    keys = components.key_store(request.app[RUNTIME])
    users = sorted({k.user for k in await keys.list(include_revoked=True)}) if keys is not None else []
    accounts = [_account(await store.balance(user)) for user in users[:BALANCES_LIMIT]]
    return json_response({"accounts": accounts, "truncated": len(users) > BALANCES_LIMIT})


@routes.get("/admin/credits/{user}")
async def balance(request: web.Request) -> web.Response:
    return json_response(_account(await _store(request).balance(request.match_info["user"])))


@routes.post("/admin/credits/{user}")
async def top_up(request: web.Request) -> web.Response:
    body = await body_of(request, TopUpBody)
    store = _store(request)
    user = request.match_info["user"]
    await store.top_up(user, to_micro(body.amount), tenant=body.tenant, note=body.note)
    return json_response(_account(await store.balance(user)))


def _ledger_filter(request: web.Request) -> LedgerFilter:
    kind = _text(request, "kind")
    if kind is not None and kind not in ("charge", "top_up"):
        raise AdminError(400, "invalid_parameter", "kind: charge or top_up")
    return LedgerFilter(user=_text(request, "user"), tenant=_text(request, "tenant"),
                        model=_text(request, "model"), kind=kind, since=_float(request, "since"),
                        until=_float(request, "until"))


@routes.get("/admin/ledger")
async def ledger(request: web.Request) -> web.Response:
    store = _store(request)
    try:
        page = await store.ledger(_ledger_filter(request), _text(request, "cursor"),
                                  _int(request, "limit", 100, 1, 500))
    except ValueError as exc:
        raise AdminError(400, "invalid_parameter", str(exc)) from None
    return json_response({"entries": [{**asdict(e), "amount_credits": format_credits(e.amount)}
                                      for e in page.entries], "next_cursor": page.next_cursor})


@routes.get("/admin/ledger.csv")
async def ledger_csv(request: web.Request) -> web.StreamResponse:
    store = _store(request)
    where = _ledger_filter(request)
    response = web.StreamResponse(headers={"Content-Type": "text/csv; charset=utf-8",
                                           "Content-Disposition": 'attachment; filename="ledger.csv"'})
    await response.prepare(request)
    async for piece in export_ledger_csv(store, where):
        await response.write(piece.encode())
    await response.write_eof()
    return response
