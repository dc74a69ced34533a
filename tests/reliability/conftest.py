"""The data-plane fixtures (``proxy``: pass-through, ``caching_proxy``: default caches) from the proxy tests."""

from tests.proxy.conftest import caching_proxy, proxy

__all__ = ["caching_proxy", "proxy"]
