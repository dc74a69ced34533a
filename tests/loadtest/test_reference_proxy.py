"""The overhead benchmark's nginx reference forwards requests and relays streams (skipped without nginx)."""

from __future__ import annotations

import httpx
import pytest

from loadtest.harness import child, free_port
from loadtest.reference_proxy import nginx_available, nginx_proxy

pytestmark = pytest.mark.skipif(not nginx_available(), reason="nginx is not installed (apt-get install nginx-light)")

BODY = {"model": "bench", "messages": [{"role": "user", "content": "What does a proxy do?"}]}


def test_nginx_forwards_answers_and_streams_of_the_trivial_upstream() -> None:
    upstream_port, nginx_port = free_port(), free_port()
    with child(["-m", "loadtest.trivial_upstream", "--port", str(upstream_port)], upstream_port), \
            nginx_proxy(nginx_port, f"127.0.0.1:{upstream_port}"), \
            httpx.Client(base_url=f"http://127.0.0.1:{nginx_port}", timeout=10) as client:
        direct = httpx.post(f"http://127.0.0.1:{upstream_port}/v1/chat/completions", json=BODY, timeout=10)
        for _ in range(3):  # kept upstream connections carry one request after another
            proxied = client.post("/v1/chat/completions", json=BODY)
            assert proxied.status_code == 200 and proxied.json() == direct.json()
        with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 1
