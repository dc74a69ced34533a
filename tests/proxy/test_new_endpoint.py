"""Adding a cacheable JSON endpoint is one row: a toy ``POST /v1/echo`` defined here (its row and its canonicaliser),
served through the real pipeline assembly in front of an upstream double that answers it, and cached like every
other answer — an exact repeat is a HIT that never reaches the upstream.

What a real one touches (issue #41's bar, at most four files): ``proxy/core/endpoints.py`` (the row, one line in
``ENDPOINTS``), its canonicaliser in ``normalizer/`` when no existing one fits, its upstream double in
``upstream_doubles/`` and its tests. Nothing else names it: no pipeline field, no route table, no branch in the
normalizer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from normalizer.bypass import BypassRules
from normalizer.canonical import EXCLUDED_FIELDS
from normalizer.canonical_json import CanonicalizationError, JSONValue
from proxy.core.endpoints import ENDPOINTS, Endpoint
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM


def canonical_echo(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The key of an echo request: its model and its text, nothing else."""
    model, text = body.get("model"), body.get("text")
    if not isinstance(model, str) or not isinstance(text, str):
        raise CanonicalizationError("model and text must be strings")
    return {"model": model, "text": text}


ECHO = Endpoint("echo", "echo", ("/v1/echo",), BypassRules(frozenset({"model", "text"}) | EXCLUDED_FIELDS.keys(),
                                                           sampled=False), canonical_echo)
"""The whole endpoint: its route, cache kind, path, bypass rules and canonicaliser (priced by tokens, its whole
answer cached, errors in the OpenAI dialect: the defaults)."""


class EchoLLM(FakeLLM):
    """The fake LLM, answering ``POST /v1/echo`` too."""

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/echo", self._echo)  # before the fake's catch-all ``/v1/{tail}``
        super().add_routes(app)

    async def _echo(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        return web.json_response({"object": "echo", "model": body["model"], "text": body["text"],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture
def upstream() -> Iterator[EchoLLM]:
    with EchoLLM() as llm:
        yield llm


@pytest.fixture
def echo_proxy(upstream: EchoLLM) -> Iterator[ProxyServer]:
    with ProxyServer(proxy_settings(upstream.url), endpoints=(*ENDPOINTS, ECHO)) as server:
        yield server


def _echo(proxy: ProxyServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/echo", json=body, timeout=30)


def test_a_repeat_of_the_new_endpoint_is_an_exact_hit(upstream: EchoLLM, echo_proxy: ProxyServer) -> None:
    body = {"model": "fake-model", "text": "hello"}
    first, second = _echo(echo_proxy, body), _echo(echo_proxy, {"text": "hello", "model": "fake-model",
                                                                 "stream": False})
    assert first.status_code == second.status_code == 200
    assert first.headers["X-Cache-Status"] == "MISS" and second.headers["X-Cache-Status"] == "HIT"
    assert second.json() == first.json() == {**first.json(), "text": "hello"}
    assert upstream.log.count("/v1/echo") == 1, "the repeat never reached the upstream"
    other = _echo(echo_proxy, {"model": "fake-model", "text": "bye"})
    assert other.headers["X-Cache-Status"] == "MISS" and other.json()["text"] == "bye"


def test_the_new_endpoint_keeps_the_rules_of_its_row(upstream: EchoLLM, echo_proxy: ProxyServer) -> None:
    unknown = _echo(echo_proxy, {"model": "fake-model", "text": "hi", "volume": 11})
    assert unknown.headers["X-Cache-Status"] == "BYPASS"
    assert "volume" in unknown.headers["X-Cache-Bypass-Reason"]
    refused = httpx.post(echo_proxy.url + "/v1/echo", content=b"[1]", timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_json"
    assert _echo(echo_proxy, {"model": "fake-model", "text": "hi", "volume": 11}).headers["X-Cache-Status"] \
        == "BYPASS"
    assert upstream.log.count("/v1/echo") == 2
