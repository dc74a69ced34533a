"""What the tiers need from the network: one bounded HTTP exchange, complete.

The tiers that call a service (the ``upstream`` embedder, the Qdrant vector store) take a :class:`Fetcher` from
their caller instead of importing the proxy's client, so that ``tiers`` sits below ``proxy`` in the import order;
:class:`proxy.upstream.client.UpstreamClient` is the one the product passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class FetchedAnswer(Protocol):
    """A complete answer: its status and body."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...

    def json(self) -> Any:
        """The body parsed as JSON (a ``ValueError`` when it is not)."""


class Fetcher(Protocol):
    """Sends one request and reads the whole answer."""

    async def fetch(self, method: str, url: str, *, headers: Mapping[str, str] = ..., body: bytes | None = None,
                    timeout_s: float | None = None, idempotent: bool | None = None) -> FetchedAnswer:
        """Bounded by ``timeout_s`` in all; ``idempotent``: the request may be resent once on a connection the
        server had closed. Raises ``OSError`` (unreachable, reset) or ``TimeoutError``."""
