"""The product's packages stand on their own: nothing in them imports the benchmarks or the tests."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

PRODUCT = ("proxy", "tiers", "normalizer", "admin", "upstream_doubles", "commands")
ROOT = Path(__file__).resolve().parents[1]


def _imported(path: Path) -> set[str]:
    """Top-level package names imported anywhere in a module, lazy imports inside functions included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_product_imports_neither_loadtest_nor_tests() -> None:
    offenders = {str(path.relative_to(ROOT)): sorted(found)
                 for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
                 if (found := _imported(path) & {"loadtest", "tests"})}
    assert offenders == {}


def test_the_product_has_one_http_client() -> None:
    """Every outbound HTTP call goes through :mod:`proxy.upstream` (aiohttp serves the admin API and the demo's test
    upstreams, and is no client); httpx is for the tests and benchmarks only."""
    clients = ("aiohttp", "httpx", "requests", "urllib3")
    offenders: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
                     if alias.name.split(".")[0] in clients}
            found |= {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module and not node.level
                      and node.module.split(".")[0] in clients
                      for alias in node.names if f"{node.module}.{alias.name}" != "aiohttp.web"}
            if found:
                offenders[str(path.relative_to(ROOT))] = sorted(found)
    assert offenders == {}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {re.split(r"[<>=;\[ ]", spec, maxsplit=1)[0] for spec in project["dependencies"]}
    assert "httpx" not in runtime and "httpx" in str(project["optional-dependencies"]["dev"])
