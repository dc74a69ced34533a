"""Imports run one way: normalizer < tiers < proxy < admin < the shipped test doubles < entry points < the load
tests and benchmarks, and no module imports itself back through others.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``. The graph comes from grimp
(import-linter's engine); import-linter's own layers contract cannot state this order, as it refuses a layer
inside another (the entry points ``proxy.commands.cli``, ``proxy.commands.serve`` and ``proxy.commands.demo`` live
inside ``proxy``) and
checks cycles between sibling packages only, not between modules.
"""

from __future__ import annotations

import graphlib

import grimp
import pytest

PACKAGES = ("normalizer", "tiers", "proxy", "admin", "loadtest")
ENTRY_POINTS = ("proxy.commands",)
DOUBLES = ("proxy.doubles",)
LAYERS = ("normalizer", "tiers", "proxy", "admin", "test doubles", "entry points", "loadtest")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def layer(module: str) -> int:
    """The module's rank in :data:`LAYERS`: it may import its own rank and below."""
    if _within(module, ENTRY_POINTS):
        return LAYERS.index("entry points")
    if _within(module, DOUBLES):
        return LAYERS.index("test doubles")
    return LAYERS.index(module.split(".")[0])


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


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
