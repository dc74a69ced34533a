"""Fixtures for the admin API: a caching proxy in front of the fake LLM, with its admin app served next to it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

TOKEN = "test-admin-token"
CHAT = "/v1/chat/completions"


def chat_body(question: str = "What is RAG?", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": question}], **extra}


def ask(proxy: ProxyServer, question: str = "What is RAG?", namespace: str | None = None,
        **extra: Any) -> httpx.Response:
    headers = {"x-ragproxy-namespace": namespace} if namespace else {}
    response = httpx.post(proxy.url + CHAT, json=chat_body(question, **extra), headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response


def reached_upstream(llm: FakeLLM) -> None:
    """Wait until a chat request has reached the upstream (a leader is in flight there)."""
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while llm.log.count(CHAT) == 0:
        assert time.monotonic() < deadline, "no request reached the upstream"
        time.sleep(0.01)


class Admin:
    """An httpx client for the admin API with the token set."""

    def __init__(self, proxy: ProxyServer, token: str | None = TOKEN) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=proxy.admin_url, headers=headers, timeout=30)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
def admin_proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim, tmp_path: Any) -> Iterator[ProxyServer]:
    """A caching proxy with the admin app (token required) and L1 only (exact counts; see ``tiered_proxy``)."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{
        "admin.token": TOKEN, "cache.l3.enabled": False, "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as server:
        yield server


@pytest.fixture
def tiered_proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim, tmp_path: Any) -> Iterator[ProxyServer]:
    """A caching proxy with its default tiers (L1 and the cold L3 under ``tmp_path``) and the admin app."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{
        "admin.token": TOKEN, "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as server:
        yield server


@pytest.fixture
def admin(admin_proxy: ProxyServer) -> Iterator[Admin]:
    client = Admin(admin_proxy)
    yield client
    client.client.close()


def only_key(admin: Admin, **filters: str) -> str:
    """The key of the single entry matching ``filters``."""
    entries = admin.get("/admin/entries", params=filters).json()["entries"]
    assert len(entries) == 1, entries
    return str(entries[0]["key"])


@pytest.fixture
def credits_proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim, tmp_path: Any) -> Iterator[ProxyServer]:
    """A caching proxy with credits on (embedded SQLite stores under ``tmp_path``) and the admin app."""
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url, **{
        "admin.token": TOKEN, "credits.enabled": True, "data_dir": str(tmp_path), "cache.l3.enabled": False})
    with ProxyServer(settings, admin=True) as server:
        yield server


@pytest.fixture
def credits_admin(credits_proxy: ProxyServer) -> Iterator[Admin]:
    client = Admin(credits_proxy)
    yield client
    client.client.close()
