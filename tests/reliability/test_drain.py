"""SIGTERM drains: a stream in flight completes (every event up to ``[DONE]``), new connections are refused, the
process exits 0 — extends ``tests/proxy/test_serve.py`` (non-streamed drain)."""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx

from tests.support.proxy_server import ProxyProcess
from upstream_doubles.llm_server import FakeLLM

BODY = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "a long streamed answer"}]}


def _refused(port: int) -> bool:
    """Whether a new connection gets no answer (refused, or closed without a response)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(100) == b""
    except OSError:
        return True


def test_sigterm_lets_a_stream_finish_and_refuses_new_connections(fake_llm_thread: FakeLLM) -> None:
    fake_llm_thread.chunk_latency_s = 0.15
    fake_llm_thread.end_latency_s = 3.0  # the response stays open after [DONE]: the drain has a stream to wait for
    proxy = ProxyProcess({"RAGPROXY_UPSTREAMS__LLM": f'[{{"url": "{fake_llm_thread.url}"}}]',
                          "RAGPROXY_CACHE__ENABLED": "false"}).start()
    received: list[bytes] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=BODY, timeout=20) as response:
            for chunk in response.iter_bytes():
                received.append(chunk)
                started.set()

    try:
        worker = threading.Thread(target=stream)
        worker.start()
        assert started.wait(10)
        proxy.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not _refused(proxy.port):  # once the signal is handled (however loaded the machine)
            assert time.monotonic() < deadline, "no new request is accepted while draining"
            time.sleep(0.02)
        assert worker.is_alive(), "refused while the stream was still in flight"
        worker.join(timeout=20)
        assert b"".join(received).rstrip().endswith(b"data: [DONE]"), "the stream in flight completes"
        assert proxy.process is not None and proxy.process.wait(timeout=15) == 0
    finally:
        proxy.stop()
