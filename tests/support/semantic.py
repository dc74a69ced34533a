"""Waits for the semantic tier's background work in tests that run a proxy with L2 on."""

from __future__ import annotations

import asyncio
import time

from tests.support.proxy_server import ProxyServer


def model_loaded(server: ProxyServer) -> None:
    """The embedding model has loaded (the proxy loads it in the background at start)."""
    assert server.semantic.ready is not None
    server.call(asyncio.wait_for(asyncio.shield(server.semantic.ready), 60))


def learned(server: ProxyServer, questions: int) -> None:
    """The index learns a question just after its answer was sent; wait for it."""
    semantic = server.semantic.semantic
    assert semantic is not None
    deadline = time.monotonic() + 30
    while server.call(semantic.store.count()) < questions:
        assert time.monotonic() < deadline, "the question was never added to the index"
        time.sleep(0.05)


def demoted(server: ProxyServer, entries: int) -> None:
    """Entries reach the cold tier through its write-behind queue; wait for them."""
    demoter = server.demoter
    assert demoter is not None
    deadline = time.monotonic() + 30
    while demoter.demoted < entries:
        assert time.monotonic() < deadline, "never written to the cold tier"
        time.sleep(0.05)
