"""HTTP header hygiene between client, proxy and upstream (RFC 9110 §7.6.1).

Hop-by-hop headers (the fixed list plus every header named in ``Connection``) never cross the proxy. The client's
credentials (``Authorization``, Qdrant's ``api-key``) are never forwarded: the proxy injects the upstream's own key
from config. ``Host`` and ``Content-Length`` are set by the upstream client for the new hop. ``X-Forwarded-For`` /
``-Proto`` / ``-Host`` describe the client; ``X-Request-ID`` and W3C ``traceparent`` travel on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

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
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _connection_tokens(headers: Mapping[str, str] | CIMultiDictProxy[str]) -> set[str]:
    tokens: set[str] = set()
    values = headers.getall("Connection", []) if isinstance(headers, CIMultiDictProxy) else [
        headers.get("Connection", "")
    ]
    for value in values:
        tokens.update(token.strip().lower() for token in value.split(",") if token.strip())
    return tokens


def _end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str]) -> CIMultiDict[str]:
    """``headers`` without hop-by-hop ones (``drop`` already includes :data:`HOP_BY_HOP`)."""
    if "Connection" in headers:
        drop = drop | _connection_tokens(headers)
    return CIMultiDict([(name, value) for name, value in headers.items() if name.lower() not in drop])


def request_id(incoming: str | None) -> str:
    """Propagate a well-formed ``X-Request-ID``; otherwise make one (never echo something unsafe)."""
    if incoming and _REQUEST_ID.match(incoming):
        return incoming
    return os.urandom(16).hex()  # 32 hex digits, as uuid4().hex, at a fraction of its cost


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    client_ip: str | None,
    scheme: str,
    host: str | None,
    request_id: str,
    auth: Mapping[str, str],
    trust_forwarded: bool = False,
) -> CIMultiDict[str]:
    """Headers to send upstream for a client request."""
    headers = _end_to_end(incoming, _REQUEST_DROP)
    prior = incoming.get("X-Forwarded-For") if trust_forwarded else None
    if not trust_forwarded:
        for name in ("X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"):
            headers.popall(name, None)
    if client_ip:
        headers["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    headers["X-Forwarded-Proto"] = scheme
    if host:
        headers["X-Forwarded-Host"] = host
    headers["X-Request-ID"] = request_id
    traceparent = incoming.get("traceparent")
    if traceparent is not None and not _TRACEPARENT.match(traceparent.strip()):
        headers.popall("traceparent", None)
        headers.popall("tracestate", None)
    headers.update(auth)
    return headers


def client_response_headers(upstream: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    """Headers to relay from an upstream response to the client."""
    return _end_to_end(upstream, _RESPONSE_DROP)
