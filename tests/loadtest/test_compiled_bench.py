"""The ``compiled`` benchmark's choice of modules (the benchmark itself needs valgrind and a C compiler)."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench.compiled import NOT_COMPILED, NOT_COMPILED_PACKAGES, compiled_modules

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_it_leaves_interpreted_exists() -> None:
    missing = [module for module in NOT_COMPILED if not (ROOT / module).is_file()]
    missing += [package for package in NOT_COMPILED_PACKAGES if not (ROOT / package).is_dir()]
    assert not missing, f"renamed or removed: {missing}; update loadtest/bench/compiled.py"


def test_it_compiles_the_data_plane_and_leaves_out_what_mypyc_cannot_take() -> None:
    modules = compiled_modules(ROOT)
    assert {"proxy/server/connection.py", "proxy/core/pipeline.py", "proxy/assembly/routes/handler.py"} <= set(modules)
    assert not set(modules) & set(NOT_COMPILED)
    assert not [module for module in modules
                if module.startswith(NOT_COMPILED_PACKAGES) or module.endswith("__init__.py")]
