"""Per-request cache control: request headers and body objects → one :class:`CachePolicy`.

Accepted directives (header names are case-insensitive; repeated headers are joined with commas):

- ``Cache-Control: no-cache``: do not read; store the fresh answer (a refresh);
- ``Cache-Control: no-store``: do not store (reading is still allowed, as in RFC 9111);
- ``Cache-Control: max-age=N``: accept only entries at most N s old; ``max-age=0`` accepts none, so it is
  handled as ``no-cache`` (a refresh);
- ``Cache-Control: s-maxage=N``: store with TTL N s;
- ``Pragma: no-cache``: as ``Cache-Control: no-cache``, only when no Cache-Control header is sent;
- ``x-ragproxy-ttl: N``: store with TTL N s (decimal seconds allowed);
- ``x-ragproxy-namespace: NAME``: the scope inside the tenant;
- ``x-portkey-cache-force-refresh: true``: as ``no-cache`` (Portkey's refresh);
- ``cf-aig-skip-cache: true``: neither read nor store (Cloudflare AI Gateway's bypass);
- ``cf-aig-cache-ttl: N``: store with TTL N s;
- body ``cache`` (LiteLLM): ``ttl`` → TTL; ``s-maxage`` → max age *for reading* (LiteLLM's documented
  meaning, unlike the header); ``no-cache``/``no-store`` (booleans) as the header directives; ``namespace``.
  Other keys are ignored, for compatibility with LiteLLM clients;
- body ``ragproxy``: the proxy's own object with ``ttl``, ``max_age``, ``no_cache``, ``no_store``,
  ``namespace``; unknown keys are an error.

Header flags accept ``true/false/1/0/yes/no``; body flags must be JSON booleans.

Precedence: the most restrictive wins, so the order of sources never matters. Any source that forbids
reading or storing forbids it; when several sources give a TTL or a max age the smallest applies; several
namespaces must agree (a conflict is an error, not a silent choice). Configuration comes last and bounds
everything: :class:`CacheDefaults` ``enabled=False`` turns reading and storing off whatever the request
says, ``ttl`` applies when no request sets one, ``max_ttl`` caps request TTLs, ``namespace`` applies when
none is given. A TTL of 0 means "do not store".

Unknown ``Cache-Control`` directives are ignored (RFC 9111 §5.2.3); malformed values of known ones
(``max-age=abc``, a negative TTL, a namespace outside ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``, a non-boolean
flag) raise :class:`CacheControlError`, which the route answers with a 400. The parsing is written here
rather than taken from an HTTP caching library because those implement response caching semantics (RFC 9111
stores), whereas these are request directives addressed to the proxy plus gateway-specific aliases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROXY_BODY_FIELDS = frozenset({"cache", "ragproxy"})
"""Body fields addressed to the proxy; never forwarded upstream."""

NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DELTA_SECONDS = re.compile(r"[0-9]+")
_DECIMAL_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
DEFAULT_TTL_S = 3600.0
"""``cache.l1.ttl_s``: seconds an entry lives when neither the request nor the settings say otherwise."""
_RAGPROXY_KEYS = frozenset({"ttl", "max_age", "no_cache", "no_store", "namespace"})


class CacheControlError(ValueError):
    """A cache-control value the proxy refuses (the route answers 400 with this message)."""


@dataclass(frozen=True, slots=True)
class CacheDefaults:
    """Operator settings that bound every request's policy.

    ``ttl``: seconds an entry lives when the request sets no TTL (``None``: until evicted).
    ``max_ttl``: cap on TTLs asked for by requests (``None``: no cap).
    """

    enabled: bool = True
    ttl: float | None = DEFAULT_TTL_S
    max_ttl: float | None = None
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """What the cache may do for one request.

    ``max_age``: serve only entries at most this many seconds old (``None``: any unexpired entry).
    ``ttl``: lifetime of an entry stored from this request (``None``: until evicted).
    ``force_refresh``: reading was skipped on request while storing is allowed (``X-Cache-Status: REFRESH``).
    ``reason``: the directives that turned reading or storing off, for logs and ``BYPASS`` reporting.
    """

    may_read: bool
    may_store: bool
    max_age: float | None
    ttl: float | None
    namespace: str
    force_refresh: bool
    reason: str | None = None


@dataclass(slots=True)
class _Directives:
    """Everything the request said, before combining."""

    no_read: list[str] = field(default_factory=list)
    no_store: list[str] = field(default_factory=list)
    max_age: list[float] = field(default_factory=list)
    ttl: list[float] = field(default_factory=list)
    namespace: dict[str, str] = field(default_factory=dict)  # source → value


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        joined[key] = f"{joined[key]},{value}" if key in joined else value
    return joined


def _seconds(text: str, source: str, pattern: re.Pattern[str] = _DECIMAL_SECONDS) -> float:
    value = text.strip().strip('"')
    if not pattern.fullmatch(value):
        raise CacheControlError(f"{source}: {text!r} is not a non-negative number of seconds")
    return float(value)


def _flag(text: str, source: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise CacheControlError(f"{source}: {text!r} is not a boolean (true/false)")


def _namespace(value: Any, source: str) -> str:
    if not isinstance(value, str) or not NAMESPACE_PATTERN.fullmatch(value):
        raise CacheControlError(
            f"{source}: {value!r} is not a valid namespace (1-64 of A-Z a-z 0-9 _ . -, starting alphanumeric)"
        )
    return value


def _cache_control(value: str, out: _Directives, source: str = "Cache-Control") -> None:
    for item in value.split(","):
        name, _, argument = item.strip().partition("=")
        name = name.strip().lower()
        if name == "no-cache":
            out.no_read.append(f"{source}: no-cache")
        elif name == "no-store":
            out.no_store.append(f"{source}: no-store")
        elif name in ("max-age", "s-maxage"):
            seconds = _seconds(argument, f"{source}: {name}", _DELTA_SECONDS)
            (out.max_age if name == "max-age" else out.ttl).append(seconds)
            if name == "max-age" and seconds == 0:
                out.no_read.append(f"{source}: max-age=0")
        # any other directive: ignored, as RFC 9111 requires for unknown directives


def _header_directives(headers: Mapping[str, str], out: _Directives) -> None:
    lowered = {name: value for name, value in _lowered(headers).items() if value.strip()}
    if "cache-control" in lowered:
        _cache_control(lowered["cache-control"], out)
    elif "pragma" in lowered and "no-cache" in lowered["pragma"].lower():
        out.no_read.append("Pragma: no-cache")
    for name in ("x-ragproxy-ttl", "cf-aig-cache-ttl"):
        if name in lowered:
            out.ttl.append(_seconds(lowered[name], name))
    if "x-ragproxy-namespace" in lowered:
        value = lowered["x-ragproxy-namespace"].strip()
        out.namespace["x-ragproxy-namespace"] = _namespace(value, "x-ragproxy-namespace")
    if "x-portkey-cache-force-refresh" in lowered and _flag(
        lowered["x-portkey-cache-force-refresh"], "x-portkey-cache-force-refresh"
    ):
        out.no_read.append("x-portkey-cache-force-refresh")
    if "cf-aig-skip-cache" in lowered and _flag(lowered["cf-aig-skip-cache"], "cf-aig-skip-cache"):
        out.no_read.append("cf-aig-skip-cache")
        out.no_store.append("cf-aig-skip-cache")


def _body_number(value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CacheControlError(f"{source}: {value!r} is not a non-negative number of seconds")
    return float(value)


def _body_flag(value: Any, source: str) -> bool:
    if not isinstance(value, bool):
        raise CacheControlError(f"{source}: {value!r} is not a boolean")
    return value


def _body_object(obj: Any, out: _Directives, name: str, keys: Mapping[str, str]) -> None:
    """One body object; ``keys`` maps its spelling of ttl/max_age/no_cache/no_store/namespace to ours."""
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise CacheControlError(f"body `{name}` must be an object")
    spelled = {ours: theirs for theirs, ours in keys.items()}
    values = {ours: obj[theirs] for ours, theirs in spelled.items() if obj.get(theirs) is not None}
    if "ttl" in values:
        out.ttl.append(_body_number(values["ttl"], f"{name}.{spelled['ttl']}"))
    if "max_age" in values:
        out.max_age.append(_body_number(values["max_age"], f"{name}.{spelled['max_age']}"))
    if "no_cache" in values and _body_flag(values["no_cache"], f"{name}.{spelled['no_cache']}"):
        out.no_read.append(f"{name}.{spelled['no_cache']}")
    if "no_store" in values and _body_flag(values["no_store"], f"{name}.{spelled['no_store']}"):
        out.no_store.append(f"{name}.{spelled['no_store']}")
    if "namespace" in values:
        out.namespace[f"{name}.namespace"] = _namespace(values["namespace"], f"{name}.namespace")


_LITELLM_KEYS = {"ttl": "ttl", "s-maxage": "max_age", "no-cache": "no_cache", "no-store": "no_store",
                 "namespace": "namespace"}  # fmt: skip
_RAGPROXY_SPELLING = {key: key for key in _RAGPROXY_KEYS}
_RAGPROXY_OTHER_KEYS = frozenset({"documents"})  # structured documents: read by the KV layer, not a cache directive


def _body_directives(body: Mapping[str, Any], out: _Directives) -> None:
    _body_object(body.get("cache"), out, "cache", _LITELLM_KEYS)
    own = body.get("ragproxy")
    if isinstance(own, dict):
        unknown = sorted(set(own) - _RAGPROXY_KEYS - _RAGPROXY_OTHER_KEYS)
        if unknown:
            known = sorted(_RAGPROXY_KEYS)
            raise CacheControlError(f"body `ragproxy`: unknown key(s) {unknown}; known: {known}")
    _body_object(own, out, "ragproxy", _RAGPROXY_SPELLING)


def _combine(said: _Directives, defaults: CacheDefaults) -> CachePolicy:
    namespaces = set(said.namespace.values())
    if len(namespaces) > 1:
        detail = ", ".join(f"{source}={value}" for source, value in sorted(said.namespace.items()))
        raise CacheControlError(f"conflicting namespaces: {detail}")
    namespace = namespaces.pop() if namespaces else defaults.namespace
    ttl = min(said.ttl) if said.ttl else defaults.ttl
    if ttl is not None and defaults.max_ttl is not None:
        ttl = min(ttl, defaults.max_ttl)
    no_store = list(said.no_store)
    if ttl == 0:
        no_store.append("ttl=0")
    if not defaults.enabled:
        return CachePolicy(False, False, None, ttl, namespace, False, "caching disabled by configuration")
    may_read, may_store = not said.no_read, not no_store
    reasons = list(dict.fromkeys(said.no_read + no_store))
    return CachePolicy(
        may_read=may_read,
        may_store=may_store,
        max_age=min(said.max_age) if said.max_age else None,
        ttl=ttl,
        namespace=namespace,
        force_refresh=not may_read and may_store,
        reason="; ".join(reasons) or None,
    )


def cache_policy(
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None = None,
    defaults: CacheDefaults | None = None,
) -> CachePolicy:
    """The policy for one request (see the module docstring for directives and precedence).

    Raises :class:`CacheControlError` on a malformed or conflicting value.
    """
    said = _Directives()
    _header_directives(headers, said)
    if body is not None:
        _body_directives(body, said)
    return _combine(said, defaults or CacheDefaults())


def split_proxy_fields(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(body without the proxy's own fields, those fields)``; ``(body, {})`` itself when it has none."""
    if PROXY_BODY_FIELDS.isdisjoint(body):
        return body, {}
    return ({key: value for key, value in body.items() if key not in PROXY_BODY_FIELDS},
            {key: value for key, value in body.items() if key in PROXY_BODY_FIELDS})
