"""A restart of the shared Redis — a persistent one (append-only file, fsync always), stopped and started again on
its port — while a replica serves: afterwards no 5xx on the data plane or the admin API, and no retried
Idempotency-Key charged twice. Before, every connection pooled before the restart failed its next command: admin
calls answered 500, the data plane 503 ("API key store unavailable") and keyed retries ran without their key.
And credits in a Redis that persists nothing are refused at start (real ``ragproxy serve`` processes)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.credits.persistence import Persistence, persistence
from tests.support.processes import VOLATILE, RedisServer, free_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
CONCURRENT = 12


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer.start(None, "--appendfsync", "always")
    yield server
    server.stop()


def _body(n: int) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": f"question {n}"}]}


async def _keyed(url: str, api_key: str, numbers: range) -> list[httpx.Response]:
    """Concurrent calls, one Idempotency-Key each (so every pooled Redis connection is in use)."""
    async with httpx.AsyncClient(base_url=url, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as client:
        return await asyncio.gather(*(client.post(CHAT, json=_body(n), headers={"Idempotency-Key": f"key-{n}"})
                                      for n in numbers))


def test_after_a_redis_restart_nothing_fails_and_no_retry_pays_twice(fake_llm_thread: FakeLLM,
                                                                     redis: RedisServer) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"redis.url": redis.url, "auth.mode": "keys",
                                                      "credits.enabled": True, "cache.enabled": False,
                                                      "redis.reconnect_s": 10.0})  # a restart on a loaded machine
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        ann = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()["key"]
        assert admin.post("/admin/credits/ann", json={"amount": 100, "tenant": "acme"}).status_code == 200
        first = asyncio.run(_keyed(server.url, ann, range(CONCURRENT)))
        assert [r.status_code for r in first] == [200] * CONCURRENT

        redis.restart()

        bob = admin.post("/admin/keys", json={"user": "bob", "tenant": "acme"})
        assert bob.status_code == 201, bob.text
        assert admin.post("/admin/credits/bob", json={"amount": 100, "tenant": "acme"}).status_code == 200
        assert admin.get("/admin/credits/ann").status_code == 200
        retried = asyncio.run(_keyed(server.url, ann, range(CONCURRENT)))
        assert [r.status_code for r in retried] == [200] * CONCURRENT, [r.text for r in retried]
        assert all(r.headers.get("Idempotent-Replayed") == "true" for r in retried), "replayed, not run again"
        assert [r.headers["X-Credits-Charged"] for r in retried] == ["0"] * CONCURRENT
        fresh = asyncio.run(_keyed(server.url, bob.json()["key"], range(CONCURRENT, 2 * CONCURRENT)))
        assert [r.status_code for r in fresh] == [200] * CONCURRENT, [r.text for r in fresh]
        assert fake_llm_thread.log.count(CHAT) == 2 * CONCURRENT
        ledger = admin.get("/admin/ledger", params={"kind": "charge", "limit": 100}).json()
        assert len(ledger["entries"]) == 2 * CONCURRENT


def test_requests_sent_while_redis_restarts_wait_for_it(fake_llm_thread: FakeLLM, redis: RedisServer) -> None:
    """A request whose key claim, reservation or settlement meets the restart itself waits it out (within
    ``redis.reconnect_s``) rather than failing: keyed requests fail closed (503) when their claim cannot be made."""
    settings = proxy_settings(fake_llm_thread.url, **{"redis.url": redis.url, "auth.mode": "keys",
                                                      "credits.enabled": True, "cache.enabled": False})
    with ProxyServer(settings, admin=True) as server, httpx.Client(base_url=server.admin_url, timeout=30) as admin:
        ann = admin.post("/admin/keys", json={"user": "ann", "tenant": "acme"}).json()["key"]
        assert admin.post("/admin/credits/ann", json={"amount": 100, "tenant": "acme"}).status_code == 200

        async def during_restart() -> list[httpx.Response]:
            sent = asyncio.ensure_future(_keyed(server.url, ann, range(40)))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(redis.restart)
            return await sent

        fake_llm_thread.latency_s = 0.1
        answers = asyncio.run(during_restart())
        assert [r.status_code for r in answers] == [200] * 40, [r.text for r in answers if r.status_code != 200]
        again = asyncio.run(_keyed(server.url, ann, range(40)))
        assert all(r.headers.get("Idempotent-Replayed") == "true" for r in again)
        assert fake_llm_thread.log.count(CHAT) == 40


@pytest.mark.parametrize(("appendonly", "save", "found"), [
    ("yes", "", Persistence.DURABLE), ("no", "3600 1 300 100", Persistence.SNAPSHOTS), ("no", "", Persistence.NONE),
    (None, None, Persistence.UNKNOWN), ("no", None, Persistence.UNKNOWN)])
def test_what_a_redis_keeps_across_a_restart(appendonly: str | None, save: str | None, found: Persistence) -> None:
    assert persistence(appendonly, save) is found


def _serve(redis: RedisServer, tmp_path: Path, **env: str) -> tuple[bool, int | None, str]:
    """``ragproxy serve`` with credits in ``redis``: whether it listened (then it is stopped), its exit code when it
    stopped on its own, its output."""
    port = free_port()
    environ = {**os.environ, "RAGPROXY_REDIS__URL": redis.url, "RAGPROXY_CREDITS__ENABLED": "true",
               "RAGPROXY_SERVER__PORT": str(port), "RAGPROXY_ADMIN__PORT": str(free_port()),
               "RAGPROXY_DATA_DIR": str(tmp_path), "RAGPROXY_LOGGING__FORMAT": "text", **env}
    process = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve"], env=environ, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                process.terminate()
                return True, None, process.communicate(timeout=30)[0]
        time.sleep(0.05)
    output = process.communicate(timeout=30)[0]
    return False, process.returncode, output


def test_credits_in_a_redis_that_persists_nothing_are_refused_at_start(tmp_path: Path) -> None:
    """A restart of such a Redis erases every balance, and the outage journal then replays as no_account: it used to
    start without a word."""
    volatile = RedisServer.start(None, *VOLATILE)
    snapshots = RedisServer.start(None, *VOLATILE, "--save", "3600 1")
    try:
        listened, code, output = _serve(volatile, tmp_path)
        assert not listened and code == 2, output
        [line] = [text for text in output.splitlines() if text.startswith("ragproxy:")]
        assert "refusing to start" in line and "credits.allow_volatile_redis" in line
        listened, _, output = _serve(volatile, tmp_path, RAGPROXY_CREDITS__ALLOW_VOLATILE_REDIS="true")
        assert listened and "without persistence" in output
        listened, _, output = _serve(snapshots, tmp_path)
        assert listened and "only takes snapshots" in output
    finally:
        volatile.stop()
        snapshots.stop()
