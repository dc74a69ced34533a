"""The OpenAPI 3.1 description of the admin API, written by hand next to the routes it describes.

Request bodies are the JSON schemas of the pydantic models that validate them (:mod:`admin.models`), so the
document and the validation cannot drift apart; responses are described here. ``tests/admin/test_openapi.py``
keeps the whole document true: schemathesis calls every operation of the running admin app and checks that no
call fails with a 5xx and that every status code, content type and JSON body conforms to this document.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from admin.models import (
    FlushBody,
    InvalidateBody,
    KeyCreateBody,
    KeyPatchBody,
    KeysDeleteBody,
    LimitsBody,
    TopUpBody,
    VersionBumpBody,
)

VERSION = "1.0.0"
REF = "#/components/schemas/{model}"

_int = {"type": "integer"}
_num = {"type": "number"}
_str = {"type": "string"}
_bool = {"type": "boolean"}
_opt_str = {"type": ["string", "null"]}
_opt_num = {"type": ["number", "null"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Any], required: list[str] | None = None, extra: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "required": list(properties) if required is None else required}
    if not extra:
        schema["additionalProperties"] = False
    return schema


_COUNTS = _obj({"requests": _int, "hits": _int, "misses": _int, "bypasses": _int, "errors": _int,
                "hit_ratio": _num, "cost_saved_s": _num})
_ENTRY = _obj({"key": _str, "tiers": {"type": "array", "items": _str}, "kind": _str, "model": _opt_str,
               "tenant": _opt_str, "namespace": _opt_str, "route": _opt_str, "question": _opt_str,
               "documents": {"type": "array", "items": _str}, "created": _num, "age_s": _num, "cost_s": _num,
               "bytes": _int})
_ACCOUNT = _obj({"user": _str, "tenant": _str, "available_micro": _int, "held_micro": _int, "available": _str,
                 "held": _str, "balance": _str})
_opt_int = {"type": ["integer", "null"]}
_LIMITS = _obj({"rpm_limit": _opt_int, "tpm_limit": _opt_int,
                "max_budget": {"type": ["string", "null"], "description": "Credits (decimal)"},
                "budget_duration": _opt_str})
_USAGE = {"type": ["object", "null"], "description": "What the scope used now (null: it has no limits)",
          "properties": {"requests": {**_opt_num, "description": "Requests in its per-minute bucket"},
                         "tokens": {**_opt_num, "description": "Tokens in its per-minute bucket"},
                         "budget_spent": {**_opt_str, "description": "Credits charged in the budget's window"},
                         "budget_resets_at": {**_opt_num, "description": "When the window ends (epoch seconds)"}},
          "required": ["requests", "tokens", "budget_spent", "budget_resets_at"]}
_API_KEY = _obj({"key_id": _str, "user": _str, "tenant": _str, "name": _str, "display": _str,
                 "created_at": _num, "revoked_at": _opt_num, "expires_at": _opt_num, "limits": _ref("Limits"),
                 "active": _bool, "expired": _bool})
_LEDGER_ENTRY = _obj({"request_id": _str, "user": _str, "tenant": _str, "kind": _str, "amount": _int,
                      "balance_after": _int, "time": _num, "amount_credits": _str},
                     required=["request_id", "user", "kind", "amount", "time"])

SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _obj({"code": _str, "message": _str})}),
    "Counts": _COUNTS,
    "Stats": _obj({
        "since": _num, "total": _ref("Counts"),
        "routes": {"type": "object", "additionalProperties": _ref("Counts")},
        "served_by_tier": {"type": "object", "additionalProperties": _ref("Counts")},
        "coalesced": _int, "cost_saved_s": _num, "hits_without_cost": _int,
        "top_entries": {"type": "array", "items": _obj({"key": _str, "hits": _int, "error": _int},
                                                         required=["key", "hits", "error"])},
        "series": _obj({"interval_s": _num, "buckets": {"type": "array", "items": _obj(
            {"start": _num, "requests": _int, "hits": _int, "misses": _int,
             "tier_hits": {"type": "object", "additionalProperties": _int}})}}),
        "tiers": {"type": "object", "additionalProperties": {"type": "object"},
                  "description": "Per tier: entries, bytes, lookup counters, hit_ratio, served (Counts)"},
        "latency_s": {"type": "object", "description": "Per cache status: p50, p90, p99 (seconds) and count",
                      "additionalProperties": {"type": "object", "additionalProperties": _opt_num}},
        "memory": {"type": "object", "description": "The memory ledger: per structure users name or fill, the bytes "
                   "it holds against its budget and the setting of that budget",
                   "additionalProperties": _obj({"bytes": _int, "budget": _int, "entries": _int, "setting": _str})},
    }),
    "Entry": _ENTRY,
    "EntryDetail": {"allOf": [_ref("Entry"), _obj({"meta": {"type": "object"}, "body": {}})]},
    "EntryPage": _obj({"entries": {"type": "array", "items": _ref("Entry")}, "next_cursor": _opt_str}),
    "Removed": _obj({"removed": {"type": "object", "additionalProperties": _int}, "total": _int}),
    "VersionBumped": _obj({"tenant": _str, "namespace": _str, "version": _str}),
    "Config": _obj({"config": {"type": "object"}, "patchable": {"type": "array", "items": _str}}),
    "ConfigPatched": _obj({"changed": {"type": "object"}, "config": {"type": "object"},
                           "patchable": {"type": "array", "items": _str}}),
    "Backends": _obj({"backends": {"type": "array", "items": _obj(
        {"name": _str, "url": _str, "kind": _str, "healthy": _bool, "in_flight": _int, "max_concurrency": _int,
         "last_error": _opt_str, "breaker": _str})},
        "knowledge_tree": {"type": ["object", "null"]}}),
    "Account": _ACCOUNT,
    "Accounts": _obj({"accounts": {"type": "array", "items": _ref("Account")}, "truncated": _bool}),
    "Limits": _LIMITS,
    "Usage": _USAGE,
    "ApiKey": _API_KEY,
    "KeyWithUsage": {"allOf": [_ref("ApiKey"), _obj({"usage": _ref("Usage")})]},
    "ScopeLimits": _obj({"kind": {"enum": ["user", "tenant"]}, "name": _str, "limits": _ref("Limits"),
                         "usage": _ref("Usage")}),
    "AllLimits": _obj({"keys": {"type": "array", "items": _ref("KeyWithUsage")}, "truncated": _bool,
                       "users": {"type": "array", "items": _ref("ScopeLimits")},
                       "tenants": {"type": "array", "items": _ref("ScopeLimits")},
                       "refused": {"type": "object", "additionalProperties": _int,
                                   "description": "Requests refused since the start, by limit"}}),
    "ApiKeys": _obj({"keys": {"type": "array", "items": _ref("ApiKey")}}),
    "CreatedKey": {"allOf": [_ref("ApiKey"), _obj({"key": _str})]},
    "Revoked": _obj({"revoked": _str}),
    "LedgerPage": _obj({"entries": {"type": "array", "items": _LEDGER_ENTRY}, "next_cursor": _opt_str}),
    "LiteLLMDeleted": _obj({"status": {"const": "success"}, "deleted": _int,
                            "removed": {"type": "object", "additionalProperties": _int}}),
    "LiteLLMFlushed": _obj({"status": {"const": "success"},
                            "removed": {"type": "object", "additionalProperties": _int}}),
    "LiteLLMPing": _obj({"status": _str, "cache_type": _str, "tiers": {"type": "array", "items": _str},
                         "off": {"type": "object", "additionalProperties": _str}, "ping_response": _bool}),
}


def _json(schema: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _error(description: str) -> dict[str, Any]:
    return _json("Error", description)


def _body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": _ref(model.__name__)}}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
            "description": description}


def _op(summary: str, ok: dict[str, Any], *, errors: dict[str, str] | None = None, tags: tuple[str, ...] = (),
        **extra: Any) -> dict[str, Any]:
    responses = {"200": ok, "401": _error("Missing or wrong admin token")}
    for status, text in (errors or {}).items():
        responses[status] = _error(text)
    return {"summary": summary, "tags": list(tags), "responses": responses, **extra}


_NO_CREDITS = "Credits are not enabled on this proxy (code credits_not_enabled), or no such item"
_BAD = "Invalid parameter or body"
_LEDGER_PARAMS = [_query("user", _str, "Only this user"), _query("tenant", _str, "Only this tenant"),
                  _query("model", _str, "Only this model"),
                  _query("kind", {"enum": ["charge", "top_up"]}, "Only this kind of entry"),
                  _query("since", {"type": "number", "minimum": 0}, "Entries at or after (epoch seconds)"),
                  _query("until", {"type": "number", "minimum": 0}, "Entries before (epoch seconds)")]


def _paths() -> dict[str, Any]:
    entry_filters = [
        _query("tenant", _str, "Only this tenant"), _query("namespace", _str, "Only this namespace"),
        _query("model", _str, "Only this model"),
        _query("q", _str, "Case-insensitive substring of the stored question"),
        _query("doc", _str, "Only entries whose prompt carried this document id"),
        _query("min_age_s", {"type": "number", "minimum": 0}, "At least this old (seconds)"),
        _query("max_age_s", {"type": "number", "minimum": 0}, "At most this old (seconds)"),
        _query("tier", _str, "Only this tier (l1, ...)"),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "Page size (default 50)"),
        _query("cursor", _str, "next_cursor of the previous page"),
    ]
    return {
        "/admin/stats": {"get": _op(
            "Requests, hits, misses and bypasses per route and tier; sizes; cost saved; top entries; latency",
            _json("Stats"), errors={"400": _BAD}, tags=("cache",),
            parameters=[_query("top", {"type": "integer", "minimum": 0, "maximum": 100}, "Top entries shown")])},
        "/admin/entries": {"get": _op("List and search cached entries (paginated)", _json("EntryPage"),
                                      errors={"400": _BAD}, tags=("cache",), parameters=entry_filters)},
        "/admin/entries/{key}": {
            "parameters": [_path("key", "The entry's cache key (URL-encoded)")],
            "get": _op("One entry: metadata and decoded body", _json("EntryDetail"),
                       errors={"404": "No entry under this key"}, tags=("cache",)),
            "delete": _op("Delete one entry from every tier", _json("Removed"),
                          errors={"404": "No entry under this key"}, tags=("cache",)),
        },
        "/admin/invalidate": {"post": _op(
            "Invalidate by keys, tenant, namespace, model, documents, collection, semantic radius or age "
            "(AND); counts per tier", _json("Removed"), errors={"400": _BAD}, tags=("cache",),
            requestBody=_body(InvalidateBody))},
        "/admin/versions/bump": {"post": _op(
            "New knowledge version for a tenant's namespace: older entries are never served again",
            _json("VersionBumped"), errors={"400": _BAD}, tags=("cache",), requestBody=_body(VersionBumpBody))},
        "/admin/flush": {"post": _op("Empty tiers (all when none named)", _json("Removed"), errors={"400": _BAD},
                                     tags=("cache",), requestBody=_body(FlushBody, required=False))},
        "/admin/config": {
            "get": _op("Effective configuration, secrets masked", _json("Config"), tags=("system",)),
            "patch": _op("Change runtime-safe settings without a restart (dotted or nested keys)",
                         _json("ConfigPatched"), errors={"400": _BAD}, tags=("system",),
                         requestBody={"required": True, "content": {"application/json": {"schema": {
                             "type": "object", "description": "e.g. {\"cache.expose_key\": true}"}}}}),
        },
        "/admin/backends": {"get": _op("LLM replicas: health, load, last error; knowledge-tree summary",
                                       _json("Backends"), tags=("system",))},
        "/admin/keys": {
            "get": _op("API keys", _json("ApiKeys"), errors={"400": _BAD, "404": _NO_CREDITS}, tags=("credits",),
                       parameters=[_query("user", _str, "Only this user"), _query("tenant", _str, "Only this tenant"),
                                   _query("include_revoked", {"enum": ["true", "false"]}, "Also revoked keys")]),
            "post": {**_op("Issue a key (the plaintext is returned once)", _json("CreatedKey", "unused"),
                           errors={"400": _BAD, "404": _NO_CREDITS}, tags=("credits",),
                           requestBody=_body(KeyCreateBody))},
        },
        "/admin/keys/{key_id}": {
            "parameters": [_path("key_id", "The key's id")],
            "get": _op("A key: its limits, expiry and usage now", _json("KeyWithUsage"), errors={"404": _NO_CREDITS},
                       tags=("limits",)),
            "patch": _op("Change a key's name, expiry (expires_at or duration) and limits (absent: unchanged, null: "
                         "removed)", _json("KeyWithUsage"), errors={"400": _BAD, "404": _NO_CREDITS},
                         tags=("limits",), requestBody=_body(KeyPatchBody)),
            "delete": _op("Revoke a key", _json("Revoked"), errors={"404": _NO_CREDITS}, tags=("credits",))},
        **{f"/admin/{kind}s/{{name}}": {
            "parameters": [_path("name", f"The {kind}")],
            "get": _op(f"A {kind}'s limits and usage now", _json("ScopeLimits"), errors={"400": _BAD,
                       "404": _NO_CREDITS}, tags=("limits",)),
            "put": _op(f"Set a {kind}'s limits (absent: none)", _json("ScopeLimits"),
                       errors={"400": _BAD, "404": _NO_CREDITS}, tags=("limits",), requestBody=_body(LimitsBody)),
            "patch": _op(f"Change a {kind}'s limits (absent: unchanged, null: removed)", _json("ScopeLimits"),
                         errors={"400": _BAD, "404": _NO_CREDITS}, tags=("limits",), requestBody=_body(LimitsBody)),
        } for kind in ("user", "tenant")},
        "/admin/limits": {"get": _op("Every key, and every user and tenant with limits, with their usage now; "
                                     "requests refused so far", _json("AllLimits"), errors={"404": _NO_CREDITS},
                                     tags=("limits",))},
        "/admin/credits": {"get": _op("Balances of every user holding a key", _json("Accounts"),
                                      errors={"404": _NO_CREDITS}, tags=("credits",))},
        "/admin/credits/{user}": {
            "parameters": [_path("user", "The user")],
            "get": _op("A user's balance", _json("Account"), errors={"404": _NO_CREDITS}, tags=("credits",)),
            "post": _op("Top up a user's credit", _json("Account"), errors={"400": _BAD, "404": _NO_CREDITS},
                        tags=("credits",), requestBody=_body(TopUpBody)),
        },
        "/admin/ledger": {"get": _op("Ledger entries (paginated)", _json("LedgerPage"),
                                     errors={"400": _BAD, "404": _NO_CREDITS}, tags=("credits",),
                                     parameters=[*_LEDGER_PARAMS, _query("cursor", _str, "From the previous page"),
                                                 _query("limit", {"type": "integer", "minimum": 1,
                                                                  "maximum": 500}, "Page size")])},
        "/admin/ledger.csv": {"get": _op(
            "The ledger as CSV", {"description": "CSV, header first", "content": {"text/csv": {"schema": _str}}},
            errors={"400": _BAD, "404": _NO_CREDITS}, tags=("credits",), parameters=_LEDGER_PARAMS)},
        "/cache/delete": {"post": _op("LiteLLM alias: delete keys", _json("LiteLLMDeleted"), errors={"400": _BAD},
                                      tags=("litellm",), requestBody=_body(KeysDeleteBody))},
        "/cache/flushall": {"post": _op("LiteLLM alias: flush every tier", _json("LiteLLMFlushed"),
                                        tags=("litellm",))},
        "/cache/ping": {"get": _op("LiteLLM alias: cache health", _json("LiteLLMPing"), tags=("litellm",))},
        "/metrics": {"get": _op("Prometheus exposition", {"description": "Prometheus text format 0.0.4",
                                                          "content": {"text/plain": {"schema": _str}}},
                                tags=("system",))},
        "/admin/openapi.json": {"get": _op("This document", {"description": "OpenAPI 3.1", "content": {
            "application/json": {"schema": {"type": "object"}}}}, tags=("system",))},
        "/admin/ui": {"get": {"summary": "The dashboard page (static; it asks for the token)", "tags": ["system"],
                              "security": [], "responses": {"200": {"description": "HTML", "content": {
                                  "text/html": {"schema": _str}}}}}},
        "/": {"get": {"summary": "Redirects to the dashboard page", "tags": ["system"], "security": [],
                      "responses": {"302": {"description": "To /admin/ui", "headers": {
                          "Location": {"schema": {"type": "string", "const": "/admin/ui"}}}}}}},
    }


@cache
def openapi_document() -> dict[str, Any]:
    """The document served at ``/admin/openapi.json``."""
    schemas = dict(SCHEMAS)
    for model in (InvalidateBody, VersionBumpBody, FlushBody, KeysDeleteBody, KeyCreateBody, KeyPatchBody, LimitsBody,
                  TopUpBody):
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    paths = _paths()
    paths["/admin/keys"]["post"]["responses"]["201"] = paths["/admin/keys"]["post"]["responses"].pop("200")
    paths["/admin/keys"]["post"]["responses"]["201"]["description"] = "Created"
    return {
        "openapi": "3.1.0",
        "info": {"title": "ragproxy admin API", "version": VERSION,
                 "description": "Control plane of ragproxy: statistics, cached entries, invalidation, "
                                "configuration, backends, credits, rate limits and budgets. Bearer token unless "
                                "bound to loopback without one."},
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
    }
