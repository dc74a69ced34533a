"""Edges of the admin API: every route answers a method it does not serve with 405 and an ``Allow`` header naming
the ones it does (RFC 9110 §15.5.6); the dashboard cannot be framed (real admin app over loopback HTTP)."""

from __future__ import annotations

import re

from admin.openapi import openapi_document
from tests.admin.conftest import Admin
from tests.support.proxy_server import ProxyServer

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def test_every_route_names_its_methods_when_refusing_another(admin_proxy: ProxyServer) -> None:
    admin = Admin(admin_proxy)
    refused = []
    for path, operations in openapi_document()["paths"].items():
        served = {method.upper() for method in operations if method.upper() in METHODS}
        url = re.sub(r"\{[^}]+\}", "x", path)
        for method in sorted(set(METHODS) - served):
            response = admin.request(method, url)
            assert response.status_code == 405, (method, path, response.status_code)
            assert response.json()["error"]["code"] == "method_not_allowed"
            allowed = {m.strip() for m in response.headers.get("Allow", "").split(",") if m.strip()}
            assert served <= allowed, (method, path, response.headers.get("Allow"))
            refused.append((method, path))
    assert len({path for _, path in refused}) >= 19


def test_the_dashboard_cannot_be_framed(admin_proxy: ProxyServer) -> None:
    page = Admin(admin_proxy).get("/admin/ui")
    assert page.status_code == 200
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
