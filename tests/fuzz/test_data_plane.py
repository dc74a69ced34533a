"""Fuzzing the data plane: bad input always ends in a 4xx JSON error in the upstream's own shape — never a 500,
never a crash, nothing stored.

Inputs (hypothesis): arbitrary bytes and invalid UTF-8, JSON of the wrong types in every known field, deeply
nested bodies, header injection (CR/LF and junk in ``X-Request-ID`` and the namespace header, sent on a raw
socket because HTTP clients refuse them), path traversal in Qdrant paths, and an upstream test double that
answers garbage event streams. The proxy, the fake LLM and the Qdrant shim are started once per module;
every test is bounded (``max_examples`` ≤ 200, no deadline) so the file runs well under a minute.
"""

from __future__ import annotations

import socket
import string
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim
from upstream_doubles.served_app import ServedApp

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/rerank",
                 "/v1/score")
SAFE_REQUEST_ID = set(string.ascii_letters + string.digits + "._:-")


class GarbageStreamLLM(ServedApp):
    """TEST DOUBLE: an 'LLM' whose every answer is ``payload`` sent as ``text/event-stream``."""

    payload: bytes = b""

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/v1/{tail:.*}", self._answer)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(self.payload)
        await response.write_eof()
        return response


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeLLM, QdrantShim]]:
    with FakeLLM() as llm, QdrantShim() as shim:
        yield llm, shim


@pytest.fixture(scope="module")
def server(upstreams: tuple[FakeLLM, QdrantShim]) -> Iterator[ProxyServer]:
    llm, shim = upstreams
    # The fake LLM, like real servers, answers some garbage with its own 500: a high breaker threshold keeps those
    # from opening the replica's breaker mid-run (see tests/reliability/test_upstream_faults.py for that finding).
    settings_ = proxy_settings(llm.url, shim.url, **{"server.max_body_bytes": 64 * 1024, "cache.l3.enabled": False,
                                                     "upstreams.breaker_failures": 1_000_000})
    with ProxyServer(settings_) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def client(server: ProxyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


def _entries(server: ProxyServer) -> int:
    return int(server.call(server.l1.stats()).entries)


def _not_ours(response: httpx.Response, upstream_calls_before: int, upstream: FakeLLM | QdrantShim) -> None:
    """A 5xx is acceptable only as the upstream's own answer, relayed: never one the proxy made up."""
    if response.status_code >= 500:
        assert upstream.log.count() > upstream_calls_before, (response.status_code, response.text[:300])
        assert b"internal_error" not in response.content and b"internal proxy error" not in response.content


def _openai_error(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and "type" in error


def _qdrant_error(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert isinstance(response.json()["status"]["error"], str)


json_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
KNOWN_FIELDS = ["model", "messages", "prompt", "input", "stream", "max_tokens", "temperature", "n", "stop",
                "seed", "tools", "response_format", "stream_options", "cache", "ragproxy", "logit_bias", "user",
                "instructions", "store", "query", "documents", "top_n", "text_1", "text_2"]


@FUZZ
@given(route=st.sampled_from(OPENAI_ROUTES), raw=st.binary(max_size=300))
def test_arbitrary_bytes(server: ProxyServer, client: httpx.Client, route: str, raw: bytes) -> None:
    before = _entries(server)
    response = client.post(route, content=raw, headers={"Content-Type": "application/json"})
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        _openai_error(response)
        assert _entries(server) == before


@FUZZ
@given(route=st.sampled_from(OPENAI_ROUTES), body=st.dictionaries(st.sampled_from(KNOWN_FIELDS), json_values,
                                                                   max_size=6))
def test_wrong_types_never_500(server: ProxyServer, client: httpx.Client, upstreams: tuple[FakeLLM, QdrantShim],
                               route: str, body: dict[str, Any]) -> None:
    before, calls = _entries(server), upstreams[0].log.count()
    response = client.post(route, json=body)
    _not_ours(response, calls, upstreams[0])
    if 400 <= response.status_code < 500:
        _openai_error(response)
        assert _entries(server) == before, "an error is never stored"


NESTING_PLACES = ["content", "part", "tool", "cache", "top"]


@FUZZ
@given(depth=st.integers(1, 3000), kind=st.sampled_from("[{"), where=st.sampled_from(NESTING_PLACES))
def test_deep_nesting(server: ProxyServer, client: httpx.Client, upstreams: tuple[FakeLLM, QdrantShim], depth: int,
                      kind: str, where: str) -> None:
    calls = upstreams[0].log.count()
    close = "]" if kind == "[" else "}"
    nested = (kind if kind == "[" else '{"a":') * depth + "1" + close * depth
    if where == "content":
        text = '{"model": "fake-model", "messages": [{"role": "user", "content": ' + nested + "}]}"
    elif where == "part":  # inside a content part: the part is valid, one of its values nests
        text = ('{"model": "fake-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", '
                '"x": ' + nested + "}]}]}")
    elif where == "tool":  # a tool's parameter schema
        text = ('{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
                '"function", "function": {"name": "f", "parameters": {"type": "object", "x": ' + nested + "}}}]}")
    elif where == "cache":
        text = '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + nested + "}"
    else:
        text = nested
    response = client.post("/v1/chat/completions", content=text.encode(),
                           headers={"Content-Type": "application/json"})
    _not_ours(response, calls, upstreams[0])
    if 400 <= response.status_code < 500:
        _openai_error(response)


def _raw_request(port: int, head: bytes, body: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    header_block = data.split(b"\r\n\r\n", 1)[0]
    lines = header_block.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


header_junk = st.binary(min_size=1, max_size=60).filter(lambda b: b"\r\n" not in b[:1])


@FUZZ
@given(request_id=header_junk, namespace=header_junk, inject=st.booleans())
def test_header_injection(server: ProxyServer, upstreams: tuple[FakeLLM, QdrantShim], request_id: bytes,
                          namespace: bytes, inject: bool) -> None:
    evil = request_id + (b"\r\nX-Injected: yes" if inject else b"")
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            b"X-Request-ID: " + evil + b"\r\nX-Ragproxy-Namespace: " + namespace + b"\r\n")
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    status, headers = _raw_request(server.settings.server.port, head, body)
    code = int(status.split()[1])
    assert code < 500, status
    assert b"x-injected" not in headers
    if b"x-request-id" not in headers:  # refused by the HTTP parser (bytes no header may hold) before any route
        assert code == 400, status
        return
    echoed = headers[b"x-request-id"]
    assert echoed and set(echoed.decode("latin-1")) <= SAFE_REQUEST_ID, "an unsafe request id is never echoed"
    llm, _ = upstreams
    if code == 200:  # (a CRLF the client sends makes its own extra request header: forwarded like any other)
        sent = llm.log.for_path("/v1/chat/completions")[-1].headers.get("X-Request-ID", "")
        assert set(sent) <= SAFE_REQUEST_ID, "the id the proxy sends upstream is always a safe one"


segment = st.sampled_from(["..", ".", "%2e%2e", "%2E%2e", "%2f", "%5c", "\\", "..%2f", "%252e%252e", "a", "c1",
                           "points", "search", "%00", "~", "etc", "passwd"])


@FUZZ
@given(parts=st.lists(segment, min_size=1, max_size=6), method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
def test_qdrant_path_traversal(server: ProxyServer, upstreams: tuple[FakeLLM, QdrantShim], parts: list[str],
                               method: str) -> None:
    _, shim = upstreams
    path = "/collections/" + "/".join(parts)
    seen = shim.log.count()
    head = f"{method} {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n".encode()
    status, _ = _raw_request(server.settings.server.port, head, b"{}")
    code = int(status.split()[1])
    assert code < 500 or code == 502, status  # 502 only if the shim itself refused the connection
    for entry in shim.log.entries[seen:]:
        segments = entry.path.split("/")
        assert entry.path.startswith("/collections/") and ".." not in segments, entry.path


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_qdrant_search_body_garbage(server: ProxyServer, client: httpx.Client,
                                    upstreams: tuple[FakeLLM, QdrantShim], raw: bytes) -> None:
    _, shim = upstreams
    seen = shim.log.count()
    response = client.post("/collections/c1/points/search", content=raw,
                           headers={"Content-Type": "application/json"})
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    assert response.status_code < 500, response.text[:300]
    if not isinstance(value, dict):
        _qdrant_error(response)
        assert shim.log.count() == seen, "a body that is not a JSON object never reaches Qdrant"


@FUZZ
@given(searches=json_values, endpoint=st.sampled_from(["search", "query", "recommend"]))
def test_qdrant_batch_of_any_shape(server: ProxyServer, client: httpx.Client, upstreams: tuple[FakeLLM, QdrantShim],
                                   searches: Any, endpoint: str) -> None:
    _, shim = upstreams
    seen = shim.log.count()
    response = client.post(f"/collections/c1/points/{endpoint}/batch", json={"searches": searches})
    if not (isinstance(searches, list) and all(isinstance(search, dict) for search in searches)):
        _qdrant_error(response)
        assert shim.log.count() == seen, "a batch that is not a list of objects never reaches Qdrant"
    else:
        _not_ours(response, seen, shim)


@FUZZ
@given(depth=st.integers(1, 1000), prefetch=st.booleans())
def test_qdrant_deep_filters_and_prefetch(server: ProxyServer, client: httpx.Client,
                                          upstreams: tuple[FakeLLM, QdrantShim], depth: int, prefetch: bool) -> None:
    _, shim = upstreams
    seen = shim.log.count()
    if prefetch:
        inner = '{"query": [1, 0], "limit": 2}'
        body = '{"prefetch": ' * depth + inner + ', "query": [1, 0]}' * depth
        path = "/collections/c1/points/query"
    else:
        body = '{"vector": [1, 0], "filter": ' + '{"must": ' * depth + '{"key": "a", "match": {"value": 1}}' \
            + "}" * depth + "}"
        path = "/collections/c1/points/search"
    response = client.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
    _not_ours(response, seen, shim)
    if 400 <= response.status_code < 500:
        _qdrant_error(response)


sse_junk = st.lists(st.sampled_from([b"data: ", b"data: [DONE]", b"\n\n", b"\n", b"{", b"}", b'"choices"', b":",
                                     b"event: x\n", b'{"choices": [{"delta": {"content": 1}}]}', b"\xff\xfe",
                                     b'{"choices": null}', b"retry: -1\n", b"data: {}\n\n"]), max_size=30)


@pytest.fixture(scope="module")
def garbage() -> Iterator[tuple[GarbageStreamLLM, ProxyServer, httpx.Client]]:
    with (GarbageStreamLLM() as llm,
          ProxyServer(proxy_settings(llm.url, **{"cache.l3.enabled": False})) as proxy,
          httpx.Client(base_url=proxy.url, timeout=10) as http):
        yield llm, proxy, http


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=sse_junk, stream=st.booleans())
def test_bogus_sse_from_upstream_is_never_stored(garbage: tuple[GarbageStreamLLM, ProxyServer, httpx.Client],
                                                 parts: list[bytes], stream: bool) -> None:
    llm, proxy, http = garbage
    llm.payload = b"".join(parts)
    proxy.call(proxy.l1.store.clear())
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code < 500
    assert response.headers.get("X-Cache-Status") != "HIT"
    proxy.call(_settle())
    if not _assembles(llm.payload):
        assert _entries(proxy) == 0, "garbage is never cached as an answer"


async def _settle() -> None:
    """One loop turn on the proxy's loop, so finish callbacks after the last byte have run."""
    import asyncio

    for _ in range(3):
        await asyncio.sleep(0)


def _assembles(payload: bytes) -> bool:
    from proxy.core.sse import assemble

    return assemble(payload) is not None
