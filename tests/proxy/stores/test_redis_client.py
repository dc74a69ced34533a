"""Failures of the store's Redis as the stores see them (:mod:`proxy.stores.redis_client`)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from proxy.auth.redis_keys import RedisKeyStore
from proxy.stores.unavailable import StoreUnavailable


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A port where something else answers (what a stopped Redis's port can hold a moment later): an HTTP server's
    refusal to every connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        listener.close()


async def test_a_server_that_is_not_redis_is_an_unavailable_store(not_redis: str) -> None:
    keys = RedisKeyStore.from_url(not_redis, timeout_s=1.0)
    try:
        with pytest.raises(StoreUnavailable):
            await keys.lookup("rp-anything")
    finally:
        await keys.client.aclose()
