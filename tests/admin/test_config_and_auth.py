"""Admin auth (token, constant-time compare, loopback rule), the refuse-to-start rule, and runtime config."""

from __future__ import annotations

import hmac
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxy.assembly.config import load_settings
from tests.admin.conftest import CHAT, TOKEN, Admin, ask, reached_upstream
from tests.support.processes import free_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

SECURED = ["/admin/stats", "/admin/entries", "/admin/config", "/admin/backends", "/metrics", "/cache/ping",
           "/admin/openapi.json"]


@pytest.mark.parametrize("path", SECURED)
def test_token_required(admin_proxy: ProxyServer, path: str) -> None:
    assert httpx.get(admin_proxy.admin_url + path).status_code == 401
    wrong = httpx.get(admin_proxy.admin_url + path, headers={"Authorization": "Bearer " + TOKEN + "x"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    basic = httpx.get(admin_proxy.admin_url + path, auth=("admin", TOKEN))
    assert basic.status_code == 401
    assert httpx.get(admin_proxy.admin_url + path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_writes_need_the_token_too(admin_proxy: ProxyServer) -> None:
    ask(admin_proxy, "kept")
    assert httpx.post(admin_proxy.admin_url + "/cache/flushall").status_code == 401
    assert httpx.post(admin_proxy.admin_url + "/admin/flush", json={}).status_code == 401
    assert ask(admin_proxy, "kept").headers["X-Cache-Status"] == "HIT"


def test_dashboard_page_is_public(admin_proxy: ProxyServer) -> None:
    page = httpx.get(admin_proxy.admin_url + "/admin/ui")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")


def test_admin_root_redirects_to_the_dashboard_without_a_token(admin_proxy: ProxyServer) -> None:
    root = httpx.get(admin_proxy.admin_url + "/")
    assert root.status_code == 302 and root.headers["Location"] == "/admin/ui"
    page = httpx.get(admin_proxy.admin_url + "/", follow_redirects=True)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")


def test_compare_is_constant_time(admin_proxy: ProxyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("hmac.compare_digest", spy)  # admin.auth calls hmac.compare_digest at request time
    response = httpx.get(admin_proxy.admin_url + "/admin/stats", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert calls == [(b"nope", TOKEN.encode())]


@pytest.fixture
def open_admin_proxy(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, qdrant_shim.url)
    with ProxyServer(settings, admin=True) as server:
        yield server


def test_open_on_loopback_without_token(open_admin_proxy: ProxyServer) -> None:
    assert httpx.get(open_admin_proxy.admin_url + "/admin/stats").status_code == 200


@pytest.mark.parametrize(("host", "token", "problem"), [
    ("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False), ("0.0.0.0", None, True),
    ("10.1.2.3", None, True), ("0.0.0.0", "t", False)])
def test_bind_rule(host: str, token: str | None, problem: bool) -> None:
    settings = load_settings(env={}, overrides={"admin.host": host, **({"admin.token": token} if token else {})})
    assert (settings.admin.bind_problem() is not None) == problem


def test_refuses_to_start_public_admin_without_token() -> None:
    env = {**os.environ, "RAGPROXY_ADMIN__HOST": "0.0.0.0", "RAGPROXY_SERVER__PORT": str(free_port()),
           "RAGPROXY_ADMIN__PORT": str(free_port()), "RAGPROXY_LOGGING__FORMAT": "text"}
    env.pop("RAGPROXY_ADMIN__TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "commands.cli", "serve"], env=env,
                           capture_output=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "admin.token" in lines[0] and lines[0].startswith("ragproxy: refusing to start")


def test_config_is_masked(admin: Admin) -> None:
    data = admin.get("/admin/config").json()
    assert data["config"]["admin"]["token"] == "**********"
    assert TOKEN not in admin.get("/admin/config").text
    assert "cache.expose_key" in data["patchable"]


def test_config_patch_takes_effect_without_restart(admin_proxy: ProxyServer, admin: Admin) -> None:
    assert "X-Cache-Key" not in ask(admin_proxy, "p").headers
    patched = admin.patch("/admin/config", json={"cache": {"expose_key": True}, "logging.access_log": True})
    assert patched.status_code == 200, patched.text
    assert patched.json()["changed"] == {"cache.expose_key": True, "logging.access_log": True}
    hit = ask(admin_proxy, "p")
    assert hit.headers["X-Cache-Status"] == "HIT", "a patch keeps the cache"
    assert hit.headers["X-Cache-Key"] == admin.get("/admin/entries").json()["entries"][0]["key"]
    assert admin.get("/admin/config").json()["config"]["cache"]["expose_key"] is True
    admin.patch("/admin/config", json={"cache.unknown_fields": "ignore"})
    assert ask(admin_proxy, "vendor", some_vendor_field=1).headers["X-Cache-Status"] == "MISS"


def test_config_patch_keeps_requests_in_flight_coalesced(fake_llm_thread: FakeLLM, admin_proxy: ProxyServer,
                                                         admin: Admin) -> None:
    """A patch changes settings in place and keeps the process's state: a request identical to one still waiting on
    the upstream shares that call after the patch, as it did before; the one in flight gets the new setting where
    it had not yet read it (``X-Cache-Key`` is set when its answer's headers are made)."""
    fake_llm_thread.latency_s = 3.0  # the follower, sent once the leader reached the upstream, must find it there
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(ask, admin_proxy, "in flight")
        reached_upstream(fake_llm_thread)
        assert admin.patch("/admin/config", json={"cache.expose_key": True}).status_code == 200
        follower = pool.submit(ask, admin_proxy, "in flight")
        leader.result(), follower.result()
    assert follower.result().headers.get("X-Cache-Coalesced") == "true"
    assert fake_llm_thread.log.count(CHAT) == 1
    assert "X-Cache-Key" in leader.result().headers


@pytest.mark.parametrize(("patch", "names"), [
    ({"server.port": 1}, "server.port"),
    ({"cache": {"l1": {"max_bytes": 5}}}, "cache.l1.max_bytes"),
    ({"cache.coalesce_wait_s": -1}, "cache.coalesce_wait_s"),
    ({"cache.unknown_fields": "maybe"}, "cache.unknown_fields"),
    ({}, "patchable keys"),
])
def test_config_patch_rejects(admin: Admin, patch: dict[str, object], names: str) -> None:
    response = admin.patch("/admin/config", json=patch)
    assert response.status_code == 400 and names in response.json()["error"]["message"]
    assert admin.patch("/admin/config", content=b"not json").status_code == 400
