"""``ragproxy serve`` as a process: health endpoints, and SIGTERM drains in-flight requests before exiting."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from tests.support.proxy_server import ProxyProcess
from upstream_doubles.llm_server import FakeLLM

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def test_health_and_sigterm_drain(fake_llm_thread: FakeLLM) -> None:
    fake_llm_thread.latency_s = 1.0
    proxy = ProxyProcess({"RAGPROXY_UPSTREAMS__LLM": f'[{{"url": "{fake_llm_thread.url}"}}]',
                          "RAGPROXY_CACHE__ENABLED": "false"}).start()
    try:
        assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
        assert httpx.get(proxy.url + "/readyz").status_code == 200
        result: dict[str, int] = {}

        def slow_call() -> None:
            result["status"] = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, timeout=10).status_code

        worker = threading.Thread(target=slow_call)
        worker.start()
        deadline = time.monotonic() + 30
        while fake_llm_thread.log.count("/v1/chat/completions") == 0:  # in flight: the upstream has it
            assert time.monotonic() < deadline, "the request never reached the upstream"
            time.sleep(0.01)
        proxy.signal(signal.SIGTERM)
        worker.join(timeout=10)
        assert result.get("status") == 200, "an in-flight request must complete during the drain"
        assert proxy.process is not None and proxy.process.wait(timeout=10) == 0
    finally:
        proxy.stop()
