"""The one failure of any store (API keys, idempotency keys, credits, response owners): it could not be reached or
did not answer in time. Callers fail closed on it, with 503 and ``Retry-After``."""

from __future__ import annotations

from proxy.core.errors import ProxyError


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer in time (fail closed: 503)."""


def store_unavailable(what: str, retry_after_s: int) -> ProxyError:
    """The answer to a request whose store (``what``: ``the credit store``, ``the API key store``) is unavailable."""
    return ProxyError(
        503,
        f"{what} is unavailable; retry shortly",
        code="credit_store_unavailable",
        headers={"Retry-After": str(retry_after_s)},
    )
