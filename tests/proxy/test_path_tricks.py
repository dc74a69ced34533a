"""Deny by default at the front door: every route the data plane serves, reached with every path trick that some
server reads differently from the proxy (dot segments, repeated slashes, encoded dots, slashes and backslashes,
double encoding, ``;`` path parameters, overlong UTF-8), is refused before routing — 400 ``bad_path`` in the
route's dialect — and nothing reaches an upstream.

The requests go out over a raw socket (:mod:`http.client`): httpx would resolve the dot segments itself.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from normalizer.paths import PathAllowList, path_problem
from proxy.assembly.app import DataPlane
from proxy.assembly.config import Settings
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


def tricks(path: str) -> list[str]:
    """``path`` rewritten so that a resolving server reads ``path`` (or a sibling of it) while the proxy does not."""
    head, _, rest = path[1:].partition("/")
    first, tail = "/" + head, "/" + rest if rest else ""
    return [
        f"{first}/.{tail}", f"{first}/x/..{tail}", f"{first}/%2e{tail}", f"{first}/x/%2E%2e{tail}",
        f"{first}/x/.%2E{tail}", f"{first}//{rest}", f"/{path}", f"{path}/.", f"{path}/..", f"{first}%2f{rest}",
        f"{first}%2F{rest}", f"{first}%5c{rest}", f"{first}\\{rest}", f"{first}/x%2f..{tail}",
        f"{first}/x/%252e%252e{tail}", f"{first}/x/..;{tail}", f"{first};x{tail}", f"{first}/x/%c0%ae%c0%ae{tail}",
        f"{first}/x/%25{tail}", f"{first}%3bx{tail}", f"{first}/%e9{tail}",
    ]


def _send(url: str, method: str, target: str) -> tuple[int, dict[str, object]]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        body = b"{}" if method in ("POST", "PUT") else b""
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def test_every_route_refuses_every_trick(proxy: ProxyServer, fake_llm_thread: FakeLLM,
                                         qdrant_shim: QdrantShim) -> None:
    routes = DataPlane(Settings()).example_paths()
    assert len(routes) >= 15, routes  # the LLM APIs, embeddings, rerank and score, health, Qdrant
    def reached() -> tuple[int, int]:  # requests of clients (the proxy's health probes carry no X-Request-ID)
        return (sum("X-Request-ID" in entry.headers for entry in fake_llm_thread.log.entries),
                sum("X-Request-ID" in entry.headers for entry in qdrant_shim.log.entries))

    before = reached()
    tried = 0
    for method, path in routes:
        for target in tricks(path):
            status, body = _send(proxy.url, method, target)
            tried += 1
            assert status == 400, (method, target, status, body)
            if method == "HEAD":  # no body to read
                continue
            if path.startswith(("/v1", "/v2", "/rerank", "/score")):
                error = body["error"]
                assert isinstance(error, dict) and error["code"] == "bad_path", (target, body)
            else:
                status_field = body.get("status")
                assert isinstance(status_field, dict) and "error" in status_field, (method, target, body)
    assert tried >= 15 * 21
    assert reached() == before, "a trick reached an upstream"


@pytest.mark.parametrize("target", [
    "/v1/chat/completions", "/v1/models?after=%2E%2E", "/collections/my.docs/points/search", "/.well-known/x",
    "/collections/a%20b", "/v1/responses/resp_1?include=%2F",
])
def test_plain_paths_have_one_reading(target: str) -> None:
    assert path_problem(target) is None


@pytest.mark.parametrize(("target", "words"), [
    ("/v1/chat%00/completions", "control characters"), ("/v1/responses/x/%252e%252e/y", "encoded twice"),
    ("/v1/responses/x/..;/y", "';'"), ("/v1/responses/x/%c0%ae%c0%ae/y", "not valid UTF-8"),
    ("/v1/responses/x/%ed%a0%80", "not valid UTF-8"), ("/v1/x%3b/y", "';'"), ("/v1/caf\u00e9", "printable ASCII"),
])
def test_what_some_server_reads_otherwise_is_refused_with_its_reason(target: str, words: str) -> None:
    problem = path_problem(target)
    assert problem is not None and words in problem, problem


def test_allow_list_matches_whole_segments() -> None:
    allowed = PathAllowList(["GET /v1/models", "GET /v1/models/*", "* /v1/batches/*/cancel"])
    assert allowed.allows("GET", "/v1/models") and allowed.allows("GET", "/v1/models/gpt")
    assert allowed.allows("POST", "/v1/batches/b1/cancel")
    assert not allowed.allows("GET", "/v1/models/")  # '*' needs a non-empty segment
    assert not allowed.allows("GET", "/v1/models/a/b") and not allowed.allows("POST", "/v1/models")
    assert not allowed.allows("GET", "/v1/modelsx")
