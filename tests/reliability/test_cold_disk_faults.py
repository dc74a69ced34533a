"""The cold tier's disk fails (file size limit: every write past the limit fails with EFBIG, as on a full disk) under
a running ``ragproxy serve`` process: requests keep succeeding from upstream and L1, the failure is logged a bounded
number of times, and the cold tier works again once the disk has room.

The limit is applied from outside with ``prlimit(2)`` on the proxy's process (Linux), so only the proxy's own file
writes are affected (CPython ignores SIGXFSZ, so writes fail instead of killing the process).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyProcess
from upstream_doubles.llm_server import FakeLLM

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
CHAT = "/v1/chat/completions"


def _body(i: int) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": f"cold question {i} " + "x" * 2000}]}


def _cold_entries(admin: str) -> int:
    stats = httpx.get(admin + "/admin/stats", timeout=10).json()
    tiers = stats.get("tiers", stats)
    return int(tiers["l3"]["entries"])


def _wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_full_disk_under_the_cold_tier_fails_open_and_recovers(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    proxy = ProxyProcess({"RAGPROXY_UPSTREAMS__LLM": f'[{{"url": "{fake_llm_thread.url}"}}]',
                          "RAGPROXY_DATA_DIR": str(tmp_path), "RAGPROXY_LOGGING__LEVEL": "info"}).start()
    admin = f"http://127.0.0.1:{proxy.env['RAGPROXY_ADMIN__PORT']}"
    try:
        assert proxy.process is not None
        with httpx.Client(base_url=proxy.url, timeout=10) as client:
            assert client.post(CHAT, json=_body(0)).status_code == 200
            assert _wait_for(lambda: _cold_entries(admin) >= 1), "the cold tier works before the fault"
            resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
            for i in range(1, 41):
                response = client.post(CHAT, json=_body(i))
                assert response.status_code == 200, response.text
            assert client.post(CHAT, json=_body(5)).headers["X-Cache-Status"] == "HIT", "L1 still serves"
            assert httpx.get(proxy.url + "/healthz").status_code == 200
            resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            before = _cold_entries(admin)
            for i in range(100, 105):
                assert client.post(CHAT, json=_body(i)).status_code == 200
            assert _wait_for(lambda: _cold_entries(admin) > before), "the cold tier recovers when the disk has room"
    finally:
        code = proxy.stop()
    log = proxy.output()
    assert code == 0, f"the proxy exits cleanly:\n{log[-3000:]}"
    failures = sum("L3" in line or "cold" in line.lower() for line in log.splitlines()
                   if "error" in line.lower() or "fail" in line.lower())
    assert 1 <= failures <= 3, f"a failing disk is logged a bounded number of times:\n{log[-3000:]}"
