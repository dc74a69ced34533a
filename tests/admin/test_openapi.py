"""The OpenAPI document is kept true: schemathesis calls every operation of the running admin app.

Checks (schemathesis 4 CLI): no 5xx (``not_a_server_error``), every status code, content type and JSON body as
documented (``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``), and
schema-invalid input answered with a 4xx (``negative_data_rejection``). The flush/delete operations really run:
the proxy under test is throw-away.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.admin.conftest import TOKEN, Admin, ask
from tests.support.proxy_server import ProxyServer

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "negative_data_rejection")


def _schemathesis() -> str | None:
    local = Path(sys.executable).with_name("st")
    return str(local) if local.exists() else shutil.which("st")


def test_document_is_openapi_31_and_lists_every_route(admin_proxy: ProxyServer, admin: Admin) -> None:
    document = admin.get("/admin/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    from admin.app import create_admin_app

    served = {(r.method, r.resource.canonical) for r in create_admin_app(admin_proxy.runtime).router.routes()
              if r.resource is not None and r.method != "HEAD"}
    documented = {(method.upper(), path) for path, item in document["paths"].items()
                  for method in item if method != "parameters"}
    served = {(m, p.replace("{key:.+}", "{key}")) for m, p in served}
    assert served == documented


@pytest.mark.skipif(_schemathesis() is None, reason="schemathesis is not installed (pip install schemathesis)")
def test_schemathesis_conformance(credits_proxy: ProxyServer, tmp_path: Path) -> None:
    url = credits_proxy.admin_url
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url + "/admin/credits/anonymous", json={"amount": 100}, headers=headers).status_code == 200
    assert httpx.post(url + "/admin/keys", json={"user": "anonymous"}, headers=headers).status_code == 201
    for question in ("a", "b", "a"):
        ask(credits_proxy, question)
    command = [_schemathesis() or "st", "run", f"{url}/admin/openapi.json", "--url", url,
               "-H", f"Authorization: Bearer {TOKEN}", "--checks", CHECKS, "--max-examples", "10",
               "--phases", "examples,coverage,fuzzing", "--seed", "1", "--generation-database", "none",
               "--request-timeout", "20", "--no-color"]
    done = subprocess.run(command, capture_output=True, timeout=300, cwd=tmp_path)
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, output[-6000:]
