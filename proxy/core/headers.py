"""HTTP header hygiene between client, proxy and upstream (RFC 9110 §7.6.1).

Hop-by-hop headers (the fixed list plus every header named in ``Connection``) never cross the proxy. The client's
credentials (``Authorization``, Qdrant's ``api-key``) are never forwarded: the proxy injects the upstream's own key
from config. ``Host`` and ``Content-Length`` are set by the upstream client for the new hop. ``X-Forwarded-For`` /
``-Proto`` / ``-Host`` describe the client; ``X-Request-ID`` and W3C ``traceparent`` travel on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from random import getrandbits

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed or meaningless on the next hop.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "authorization", "api-key", "accept-encoding", "expect"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}
# The proxy sets these itself (X-Forwarded-For extends a trusted client's chain; -Host keeps a trusted one when the
# request names no host).
_TRUSTED_DROP = _REQUEST_DROP | {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-request-id"}
_UNTRUSTED_DROP = _TRUSTED_DROP | {"forwarded"}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", []):
        tokens.update(token.strip().lower() for token in value.split(",") if token.strip())
    return tokens


def request_id(incoming: str | None) -> str:
    """Propagate a well-formed ``X-Request-ID``; otherwise make one (never echo something unsafe).

    A made-up id is 128 random bits from :mod:`random` (32 hex digits, as ``uuid4().hex``): it only has to be
    unique, not secret, and the module's generator is reseeded in every forked or spawned process."""
    if incoming and _REQUEST_ID.match(incoming):
        return incoming
    return getrandbits(128).to_bytes(16).hex()


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    client_ip: str | None,
    scheme: str,
    host: str | None,
    request_id: str,
    auth: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    trust_forwarded: bool = False,
) -> list[tuple[str, str]]:
    """Headers to send upstream for a client request, in one pass over the client's.

    ``auth`` (the upstream's key) and ``extra`` (routing hints, trace context) replace any client header of the
    same name."""
    drop = _TRUSTED_DROP if trust_forwarded else _UNTRUSTED_DROP
    if "Connection" in incoming:
        drop = drop | _connection_tokens(incoming)
    traceparent = incoming.get("traceparent")
    if traceparent is not None and not _TRACEPARENT.match(traceparent.strip()):
        drop = drop | {"traceparent", "tracestate"}
    if auth or extra:
        drop = drop | {name.lower() for name in auth} | {name.lower() for name in extra or ()}
    headers = [(name, value) for name, value in incoming.items() if name.lower() not in drop]
    prior = ", ".join(incoming.getall("X-Forwarded-For", ())) if trust_forwarded else None
    if client_ip:
        headers.append(("X-Forwarded-For", f"{prior}, {client_ip}" if prior else client_ip))
    elif prior:
        headers.append(("X-Forwarded-For", prior))
    headers.append(("X-Forwarded-Proto", scheme))
    forwarded_host = host or (incoming.get("X-Forwarded-Host") if trust_forwarded else None)
    if forwarded_host:
        headers.append(("X-Forwarded-Host", forwarded_host))
    headers.append(("X-Request-ID", request_id))
    headers.extend(auth.items())
    if extra:
        headers.extend(extra.items())
    return headers


def client_response_headers(upstream: Sequence[tuple[str, str]]) -> CIMultiDict[str]:
    """Headers to relay from an upstream response (its raw header pairs) to the client."""
    kept = []
    connection = False
    for name, value in upstream:
        lower = name.lower()
        if lower in _RESPONSE_DROP:
            connection = connection or lower == "connection"
        else:
            kept.append((name, value))
    headers = CIMultiDict(kept)
    if connection:  # rare from a server: drop what its Connection header names too
        for token in _connection_tokens(CIMultiDict(upstream)):
            headers.popall(token, None)
    return headers
