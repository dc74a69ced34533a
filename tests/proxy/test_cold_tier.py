"""The cold tier through HTTP: written behind L1, serves after a restart, promoted back into L1."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "What survives a restart?"}]}


def _wait_for_cold_write(server: ProxyServer) -> None:
    demoter = server.demoter
    assert demoter is not None
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while demoter.demoted < 1:
        assert time.monotonic() < deadline, "the write-behind queue never reached the cold tier"
        time.sleep(0.05)


def test_restarted_proxy_serves_from_cold_then_promotes(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"data_dir": str(tmp_path)})
    with ProxyServer(settings) as first:
        original = httpx.post(first.url + CHAT, json=BODY)
        assert original.headers["X-Cache-Status"] == "MISS"
        _wait_for_cold_write(first)
    settings = proxy_settings(fake_llm_thread.url, **{"data_dir": str(tmp_path)})
    with ProxyServer(settings) as second:
        cold = httpx.post(second.url + CHAT, json=BODY)
        assert (cold.headers["X-Cache-Status"], cold.headers["X-Cache-Tier"]) == ("HIT", "l3")
        assert cold.json() == original.json()
        warm = httpx.post(second.url + CHAT, json=BODY)
        assert warm.headers["X-Cache-Tier"] == "l1", "an L3 hit is promoted into L1"
    assert fake_llm_thread.log.count(CHAT) == 1


def test_warm_up_fills_l1_at_start(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    with ProxyServer(proxy_settings(fake_llm_thread.url, **{"data_dir": str(tmp_path)})) as first:
        httpx.post(first.url + CHAT, json=BODY)
        _wait_for_cold_write(first)
    settings = proxy_settings(fake_llm_thread.url, **{"data_dir": str(tmp_path), "cache.l3.warmup_entries": 10})
    with ProxyServer(settings) as second:
        assert httpx.post(second.url + CHAT, json=BODY).headers["X-Cache-Tier"] == "l1"
