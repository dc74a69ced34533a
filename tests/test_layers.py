"""Imports run one way: normalizer < tiers < proxy < admin < the test doubles of the upstreams (``upstream_doubles``,
shipped for the demo) < the entry points (``commands``) < the load tests and benchmarks, and no module imports itself
back through others. So the product's data and control planes never import a double; the demo, the load tests and
the tests do.

Inside ``proxy/`` the folders are layers too: the HTTP server < the core (context, reply, pipeline, outcome, wire
helpers, the cache tier's contract) < the upstream transport < the stores' shared plumbing < the features (one package
each) < the cache-tier registry and shared mode < assembly. No folder imports one above it, none excepted (what a
feature hands to later stages is a key the feature declares, not a slot the core must name), and the folders import
each other in no circle.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``. The graph comes from grimp
(import-linter's engine); import-linter's own contracts check cycles between sibling packages only, not between
modules.
"""

from __future__ import annotations

import graphlib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("normalizer", "tiers", "proxy", "admin", "upstream_doubles", "commands", "loadtest")
"""The top-level packages, lowest first."""


PROXY_LAYERS = (
    ("proxy.server",),
    ("proxy.core",),
    ("proxy.upstream",),
    ("proxy.stores",),
    ("proxy.observability", "proxy.auth", "proxy.idempotency", "proxy.credits", "proxy.rate_limits", "proxy.search",
     "proxy.answers", "proxy.items", "proxy.kv", "proxy.stored"),
    ("proxy.cache_tiers",),
    ("proxy.assembly",),
)
"""The layers inside ``proxy/``, lowest first; the features (one rank) may import each other, in no circle."""
def layer(module: str) -> int:
    """The module's rank in :data:`LAYERS`: it may import its own rank and below."""
    return LAYERS.index(module.split(".")[0])


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*LAYERS, cache_dir=None)


def test_imports_run_one_way(graph: grimp.ImportGraph) -> None:
    upward = sorted(
        f"{importer}:{detail['line_number']} imports {imported} ({LAYERS[layer(importer)]} < {LAYERS[layer(imported)]})"
        for importer in graph.modules for imported in graph.find_modules_directly_imported_by(importer)
        if layer(imported) > layer(importer)
        for detail in graph.get_import_details(importer=importer, imported=imported))
    assert not upward, "\n".join(upward)


def test_no_module_imports_itself_back(graph: grimp.ImportGraph) -> None:
    sorter = graphlib.TopologicalSorter({module: graph.find_modules_directly_imported_by(module)
                                         for module in graph.modules})
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(reversed(error.args[1]))}")


def proxy_folder(module: str) -> str | None:
    """The folder of ``proxy/`` that ``module`` belongs to, when it is one of :data:`PROXY_LAYERS`."""
    folder = ".".join(module.split(".")[:2])
    return folder if any(folder in rank for rank in PROXY_LAYERS) else None


def proxy_rank(folder: str) -> int:
    return next(rank for rank, folders in enumerate(PROXY_LAYERS) if folder in folders)


def _proxy_imports(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Every import between two different layered folders of ``proxy/``, as (importer, imported) modules."""
    return [(importer, imported) for importer in sorted(graph.modules) if proxy_folder(importer)
            for imported in graph.find_modules_directly_imported_by(importer)
            if proxy_folder(imported) not in (None, proxy_folder(importer))]


def test_every_proxy_folder_has_a_layer() -> None:
    folders = {path.name for path in (ROOT / "proxy").iterdir()
               if path.is_dir() and (path / "__init__.py").exists()}
    layered = {folder.split(".")[1] for rank in PROXY_LAYERS for folder in rank}
    assert folders <= layered, "a new folder of proxy/ needs its layer here"
    assert not [path.name for path in (ROOT / "proxy").glob("*.py") if path.name != "__init__.py"], \
        "a module loose in proxy/ belongs in one of its folders"


def test_proxy_folders_import_only_down(graph: grimp.ImportGraph) -> None:
    upward = sorted(f"{importer} imports {imported}" for importer, imported in _proxy_imports(graph)
                    if proxy_rank(proxy_folder(imported) or "") > proxy_rank(proxy_folder(importer) or ""))
    assert not upward, "\n".join(upward)


def test_no_circle_between_proxy_folders(graph: grimp.ImportGraph) -> None:
    folders: dict[str, set[str]] = {}
    for importer, imported in _proxy_imports(graph):
        folders.setdefault(proxy_folder(importer) or "", set()).add(proxy_folder(imported) or "")
    try:
        graphlib.TopologicalSorter(folders).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"folders of proxy/ import each other: {' -> '.join(reversed(error.args[1]))}")
