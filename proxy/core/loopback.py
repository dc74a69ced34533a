"""The loopback bind address: the default of every listener the proxy and its doubles open, and the test of whether
an address only accepts connections from this machine."""

from __future__ import annotations

import ipaddress

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
