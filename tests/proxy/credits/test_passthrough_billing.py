"""Nothing forwarded under the proxy's own key is free: the allowed LLM pass-through and Qdrant requests other than
searches are authenticated and charged ``credits.request_price`` each; a user without credits gets 429
``insufficient_quota`` there too."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from proxy.core.outcome import MICRO
from proxy.credits.store import ledger_entries
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


@pytest.fixture
def billed(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path), "credits.request_price": "0.25",
        "credits.sqlite_synchronous": "NORMAL"})
    with ProxyServer(settings) as server:
        yield server


def _key(server: ProxyServer, user: str, credits: float) -> dict[str, str]:
    created = server.call(server.runtime.credits.keys.create(user, "acme"))  # type: ignore[union-attr]
    if credits:
        server.call(server.runtime.credits.store.top_up(user, int(credits * MICRO), tenant="acme"))  # type: ignore[union-attr]
    return {"Authorization": f"Bearer {created.plaintext}", "api-key": str(created.plaintext)}


def _charges(server: ProxyServer, user: str) -> list[int]:
    async def entries() -> list[int]:
        store = server.runtime.credits.store
        assert store is not None
        return [e.cost async for e in ledger_entries(store) if e.user == user and e.kind == "charge"]
    return server.call(entries())


def test_pass_through_needs_a_key_and_credits(billed: ProxyServer, fake_llm_thread: FakeLLM,
                                              qdrant_shim: QdrantShim) -> None:
    assert httpx.get(billed.url + "/v1/models").status_code == 401
    broke = _key(billed, "broke", 0)
    for method, path in (("GET", "/v1/models"), ("GET", "/collections"), ("PUT", "/collections/c/points")):
        refused = httpx.request(method, billed.url + path, headers=broke,
                                json={"points": []} if method == "PUT" else None)
        assert refused.status_code == 429, (method, path, refused.text)
    assert not [r for r in fake_llm_thread.log.entries if r.headers.get("Authorization")]
    assert not [r for r in qdrant_shim.log.entries if r.path != "/"]


def test_each_forwarded_request_is_charged_its_price(billed: ProxyServer) -> None:
    paying = _key(billed, "paying", 10)
    models = httpx.get(billed.url + "/v1/models", headers=paying)
    assert models.status_code == 200 and models.headers["X-Credits-Charged"] == "0.25"
    assert httpx.get(billed.url + "/collections", headers=paying).status_code == 200
    assert _charges(billed, "paying") == [int(Decimal("0.25") * MICRO)] * 2
