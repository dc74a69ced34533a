"""HTTP header hygiene between client, proxy and upstream (RFC 9110 §7.6.1).

**Headers to an upstream are an allow-list.** Of the client's headers only those named in
:data:`FORWARDED_REQUEST_HEADERS` go upstream (``Accept``, ``User-Agent``, ``OpenAI-Beta``, and W3C
``traceparent``/``tracestate`` when ``traceparent`` is well-formed), plus any an operator names in
``upstreams.forward_headers`` — never one of :data:`NEVER_FORWARDED`: credentials (the proxy sends the upstream's
own key), hop-by-hop headers, headers that rewrite a request on servers that honour them (``X-Original-URL``,
``X-Rewrite-URL``, ``X-HTTP-Method-Override``, ``X-Method-Override``), client addresses and forwarding headers the
client wrote (``X-Forwarded-*``, ``Forwarded``, ``X-Real-IP``...), ``Idempotency-Key`` (the proxy keeps its own; the
upstream's would be shared by every tenant under the proxy's key), and headers that choose the upstream account
(``OpenAI-Organization``, ``OpenAI-Project``: the operator's, unless named). The proxy writes the rest itself:
``Content-Type`` of the body it serialised, ``X-Request-ID``, ``X-Forwarded-For`` (the peer; appended to a trusted
client's chain with ``server.trust_forwarded``) and ``X-Forwarded-Proto``. ``Host`` and ``Content-Length`` are set by
the upstream client for the new hop. A header named in ``Connection`` is hop-by-hop for that request: never
forwarded, even when listed (and never part of a cache key: :func:`normalizer.canonical.request_variant`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
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
FORWARDED_REQUEST_HEADERS = frozenset({"accept", "user-agent", "openai-beta", "traceparent", "tracestate"})
"""The client headers an upstream gets by default (what OpenAI-compatible servers and the SDKs use)."""
NEVER_FORWARDED = HOP_BY_HOP | frozenset({
    "host", "content-length", "content-type", "content-encoding", "accept-encoding", "expect", "authorization",
    "api-key", "cookie", "proxy-authorization", "x-request-id", "idempotency-key", "x-original-url", "x-rewrite-url",
    "x-original-uri", "x-original-method", "x-http-method-override", "x-http-method", "x-method-override",
    "forwarded", "x-real-ip", "x-client-ip", "true-client-ip", "client-ip", "x-cluster-client-ip",
    "cf-connecting-ip", "x-original-host", "x-host", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
    "x-forwarded-port", "x-forwarded-prefix", "x-forwarded-server", "x-forwarded-scheme", "x-forwarded-ssl",
})  # fmt: skip
"""Headers never taken from a client, even when an operator lists them (see the module docstring); any
``X-Forwarded-*`` too."""
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}
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


def forwardable(name: str) -> bool:
    """Whether an operator may add the client header ``name`` to the allow-list (``upstreams.forward_headers``)."""
    lower = name.lower()
    return lower not in NEVER_FORWARDED and not lower.startswith("x-forwarded-")


def forwarded_headers(extra: Iterable[str] = ()) -> frozenset[str]:
    """The allow-list: :data:`FORWARDED_REQUEST_HEADERS` and the operator's ``extra`` names, lower-cased."""
    return FORWARDED_REQUEST_HEADERS | {name.lower() for name in extra if forwardable(name)}


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    client_ip: str | None,
    scheme: str,
    request_id: str,
    auth: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    trust_forwarded: bool = False,
    allowed: frozenset[str] = FORWARDED_REQUEST_HEADERS,
    content_type: str | None = None,
) -> list[tuple[str, str]]:
    """Headers to send upstream for a client request: the client's that ``allowed`` names (see the module
    docstring), then the proxy's own. ``auth`` (the upstream's key) and ``extra`` (routing hints, trace context)
    replace any client header of the same name; ``content_type``: the body's, when one is sent."""
    keep = allowed
    if "Connection" in incoming:
        keep = keep - _connection_tokens(incoming)
    traceparent = incoming.get("traceparent")
    if traceparent is not None and not _TRACEPARENT.match(traceparent.strip()):
        keep = keep - {"traceparent", "tracestate"}
    if extra:  # the upstream's key (auth) is never an allowed name
        keep = keep - {name.lower() for name in extra}
    headers = [(name, value) for name, value in incoming.items() if name.lower() in keep]
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    prior = ", ".join(incoming.getall("X-Forwarded-For", ())) if trust_forwarded else None
    if client_ip:
        headers.append(("X-Forwarded-For", f"{prior}, {client_ip}" if prior else client_ip))
    elif prior:
        headers.append(("X-Forwarded-For", prior))
    headers.append(("X-Forwarded-Proto", scheme))
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
