"""``PATCH /admin/config``: each live key changes what the next request gets, and nothing is rebuilt.

``cache.expose_key`` and ``cache.unknown_fields`` are covered next to the config API itself
(``test_config_and_auth.py``); the other live keys are here, each seen through HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxy.answers.cache_policy import ApplyCacheControl, Canonicalize
from proxy.answers.coalesce import Coalesce
from proxy.answers.replies import StoreResponse
from tests.admin.conftest import CHAT, Admin, ask, chat_body, reached_upstream
from tests.support.proxy_server import ProxyServer
from upstream_doubles.llm_server import FakeLLM


def _patched(admin: Admin, patch: dict[str, object]) -> None:
    response = admin.patch("/admin/config", json=patch)
    assert response.status_code == 200, response.text


def test_a_patch_changes_the_stages_in_place(admin_proxy: ProxyServer, admin: Admin) -> None:
    assert admin_proxy.plane is not None
    pipelines = admin_proxy.plane.pipelines
    stages = {name: pipeline.stages for name, pipeline in pipelines.by_route().items()}
    _patched(admin, {"cache": {"l1.ttl_s": 60, "cache_sampled": False, "unknown_fields": "ignore",
                               "coalesce_wait_s": 2.5, "expose_key": True, "shared_namespaces": ["faq"]}})
    assert admin_proxy.plane is not None and admin_proxy.plane.pipelines is pipelines, "no pipeline is rebuilt"
    assert {name: pipeline.stages for name, pipeline in pipelines.by_route().items()} == stages
    assert admin_proxy.stage(ApplyCacheControl).defaults.ttl == 60
    canonicalize = admin_proxy.stage(Canonicalize)
    assert (canonicalize.bypass.cache_sampled, canonicalize.bypass.unknown_fields) == (False, "ignore")
    assert canonicalize.shared == {"faq"}
    assert admin_proxy.stage(StoreResponse).expose_key is True
    assert admin_proxy.stage(Coalesce, "completions").wait_s == 2.5


def test_default_ttl(admin_proxy: ProxyServer, admin: Admin) -> None:
    """An answer lives as long as the TTL in force when it was stored."""
    assert ask(admin_proxy, "stored before").headers["X-Cache-Status"] == "MISS"
    _patched(admin, {"cache.l1.ttl_s": 0.3})
    assert ask(admin_proxy, "stored after").headers["X-Cache-Status"] == "MISS"
    time.sleep(0.5)
    assert ask(admin_proxy, "stored after").headers["X-Cache-Status"] == "MISS", "expired after 0.3 s"
    assert ask(admin_proxy, "stored before").headers["X-Cache-Status"] == "HIT", "stored for an hour"


def test_cache_sampled(admin_proxy: ProxyServer, admin: Admin) -> None:
    assert ask(admin_proxy, "sampled", temperature=0.9).headers["X-Cache-Status"] == "MISS"
    _patched(admin, {"cache.cache_sampled": False})
    bypassed = ask(admin_proxy, "sampled", temperature=0.9)
    assert bypassed.headers["X-Cache-Status"] == "BYPASS"
    assert "temperature" in bypassed.headers["X-Cache-Bypass-Reason"]
    assert ask(admin_proxy, "sampled", temperature=0).headers["X-Cache-Status"] == "MISS", "greedy is cached"


def test_shared_namespaces(admin_proxy: ProxyServer, admin: Admin) -> None:
    """A namespace made shared is keyed under the shared tenant from the next request on."""
    assert ask(admin_proxy, "opening hours?", namespace="faq").headers["X-Cache-Status"] == "MISS"
    assert ask(admin_proxy, "opening hours?", namespace="faq").headers["X-Cache-Status"] == "HIT"
    _patched(admin, {"cache.shared_namespaces": ["faq"]})
    assert ask(admin_proxy, "opening hours?", namespace="faq").headers["X-Cache-Status"] == "MISS"
    assert ask(admin_proxy, "opening hours?", namespace="faq").headers["X-Cache-Status"] == "HIT"
    keys = [entry["key"] for entry in admin.get("/admin/entries", params={"namespace": "faq"}).json()["entries"]]
    assert len(keys) == 2 and len(set(keys)) == 2


def test_coalesce_wait(fake_llm_thread: FakeLLM, admin_proxy: ProxyServer, admin: Admin) -> None:
    """A duplicate waits for the leader at most ``cache.coalesce_wait_s``, then asks the upstream itself."""
    _patched(admin, {"cache.coalesce_wait_s": 0.2})
    fake_llm_thread.latency_s = 1.0
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(ask, admin_proxy, "slow")
        reached_upstream(fake_llm_thread)
        follower = pool.submit(ask, admin_proxy, "slow")
        leader.result(), follower.result()
    assert "X-Cache-Coalesced" not in follower.result().headers
    assert fake_llm_thread.log.count(CHAT) == 2


@pytest.fixture
def root_level() -> Iterator[None]:
    """The root logger's level is the process's: put it back after a test that patches it."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def _logged(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> bool:
    """Whether a new request left an access-log line (written once the answer is sent: waited for)."""
    stats, request_id = proxy.runtime.stats, uuid.uuid4().hex
    observed = stats.total.requests
    response = httpx.post(proxy.url + CHAT, json=chat_body("logged?"), headers={"X-Request-ID": request_id},
                          timeout=30)
    assert response.status_code == 200
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while stats.total.requests == observed:
        assert time.monotonic() < deadline, "the request was never accounted for"
        time.sleep(0.01)
    proxy.call(asyncio.sleep(0))  # the proxy's loop has finished accounting for it (the access log comes last)
    return any(getattr(record, "request_id", None) == request_id for record in caplog.records
               if record.name == "ragproxy.access")


def test_access_log_and_level(admin_proxy: ProxyServer, admin: Admin, caplog: pytest.LogCaptureFixture,
                              root_level: None) -> None:
    _patched(admin, {"logging.level": "info"})
    assert not _logged(admin_proxy, caplog), "off by default"
    _patched(admin, {"logging.access_log": True})
    assert _logged(admin_proxy, caplog)
    _patched(admin, {"logging.level": "warning"})
    assert logging.getLogger().level == logging.WARNING
    assert not _logged(admin_proxy, caplog), "an info line under a warning level"
    _patched(admin, {"logging": {"level": "debug", "access_log": False}})
    assert logging.getLogger().level == logging.DEBUG
    assert not _logged(admin_proxy, caplog)
