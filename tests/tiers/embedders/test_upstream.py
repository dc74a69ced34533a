"""The upstream backend, through the proxy's upstream client, against a test double of an OpenAI-compatible
embeddings server (aiohttp)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from proxy.upstream.client import UpstreamClient
from tests.support.processes import free_port, refused_port
from tiers.embedders.upstream import UpstreamEmbedder, UpstreamEmbeddingError

DIM = 4


class FakeEmbeddingsServer:
    """Test double of ``POST /v1/embeddings``: vector [len(text), 1, 0, 0] (not normalized), rows in reverse
    order with their ``index`` (clients must sort); records each request body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.body: Any = None

    async def handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.requests.append({"json": payload, "auth": request.headers.get("Authorization")})
        await asyncio.sleep(0.01)
        if self.status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=self.status)
        if self.body is not None:
            return web.json_response(self.body)
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(text)), 1.0, 0.0, 0.0]}
            for i, text in enumerate(payload["input"])
        ]
        return web.json_response({"object": "list", "data": data[::-1], "model": payload["model"]})


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    http = UpstreamClient(connect_timeout=2, read_timeout=5, pool_size=4)
    yield http
    await http.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeEmbeddingsServer, str]]:
    fake = FakeEmbeddingsServer()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield fake, f"http://127.0.0.1:{port}/v1/embeddings"
    await runner.cleanup()


async def test_rows_come_back_in_input_order_normalized(server: tuple[FakeEmbeddingsServer, str],
                                                        client: UpstreamClient) -> None:
    fake, url = server
    embedder = UpstreamEmbedder(url, "emb-model", DIM, client=client, api_key="sk-test")
    rows = await embedder.embed(["a", "abc"])
    expected = np.array([[1, 1, 0, 0], [3, 1, 0, 0]], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(rows, expected, rtol=1e-6)
    assert fake.requests[0]["json"]["model"] == "emb-model"
    assert fake.requests[0]["auth"] == "Bearer sk-test"
    assert embedder.name == "upstream:emb-model" and embedder.dim == DIM
    await embedder.close()


async def test_concurrent_requests_share_one_http_call(server: tuple[FakeEmbeddingsServer, str],
                                                      client: UpstreamClient) -> None:
    fake, url = server
    embedder = UpstreamEmbedder(url, "m", DIM, client=client, max_wait_s=0.005)
    results = await asyncio.gather(*(embedder.embed(["x" * n]) for n in range(1, 6)))
    assert len(fake.requests) == 1
    assert fake.requests[0]["json"]["input"] == ["x", "xx", "xxx", "xxxx", "xxxxx"]
    assert [round(float(r[0, 0] / r[0, 1])) for r in results] == [1, 2, 3, 4, 5]
    await embedder.close()


async def test_errors_and_malformed_answers_raise(server: tuple[FakeEmbeddingsServer, str],
                                                 client: UpstreamClient) -> None:
    fake, url = server
    embedder = UpstreamEmbedder(url, "m", DIM, client=client)
    fake.status = 500
    with pytest.raises(UpstreamEmbeddingError, match="500"):
        await embedder.embed(["a"])
    fake.status = 200
    fake.body = {"data": [{"index": 0, "embedding": [1.0, 2.0]}]}
    with pytest.raises(UpstreamEmbeddingError, match="expected 1x4"):
        await embedder.embed(["a"])
    fake.body = {"unexpected": True}
    with pytest.raises(UpstreamEmbeddingError, match="malformed"):
        await embedder.embed(["a"])
    await embedder.close()


async def test_an_unreachable_upstream_raises(client: UpstreamClient) -> None:
    embedder = UpstreamEmbedder(f"http://127.0.0.1:{refused_port()}/v1/embeddings", "m", DIM, client=client,
                                timeout_s=2)
    with pytest.raises(UpstreamEmbeddingError):
        await embedder.embed(["a"])
    await embedder.close()
