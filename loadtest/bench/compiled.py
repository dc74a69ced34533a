"""``python -m loadtest.bench compiled [--quick] [--json]``: what compiling the proxy's own code would buy.

The proxy ships interpreted. This benchmark puts a figure on the option of compiling its Python to C extensions
with mypyc (the compiler that comes with mypy, which the code already satisfies in strict mode): it copies the
source packages to a temporary directory, compiles there the modules of ``proxy`` that mypyc accepts as they are,
and runs the ``instructions`` benchmark (valgrind) once in the copy and once in the source tree, reporting both
and their ratio. With ``--timings N`` it also runs the ``overhead`` benchmark ``N`` times in each, alternating, and
reports the medians of its main figures: what the instructions saved buy in time on the machine at hand. Nothing
in the source tree changes.

Left interpreted, because mypyc does not take them unchanged: modules with async generators or
``@asynccontextmanager`` functions (``upstream/client.py``, ``stages/coalesce.py``, ``stages/answers.py``,
``kv/admission_queue.py`` and most of ``auth/``, ``idempotency/``, ``credits/``, ``rate_limits/`` and ``stores/``),
``upstream/http1.py`` (exceptions that subclass ``OSError`` need ``mypyc_attr(native_class=False)``, and an async
generator), ``kv/stages.py`` (a subclass of ``functools.partial``, a C type outside ``builtins``, which mypyc does not
support), the rest of those five packages and ``assembly/credit_components.py`` (runtime-checkable Protocols fail at
import once compiled), and the start-up-only configuration and CLI modules. So the forwarding client stays
interpreted here: the figures are what compiling gives with no source change, not the most it could give. Compiling
takes about a minute on two cores, the whole run about four (plus about a minute per timing run). Needs valgrind and
mypy's ``mypyc`` (the ``dev`` extra)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "tiers", "normalizer", "admin", "upstream_doubles", "commands", "loadtest")
NOT_COMPILED = (
    "proxy/upstream/client.py", "proxy/upstream/http1.py", "proxy/answers/coalesce.py", "proxy/answers/replies.py",
    "proxy/kv/admission_queue.py", "proxy/kv/stages.py", "proxy/assembly/config.py",
    "proxy/assembly/config_reference.py", "proxy/assembly/credit_components.py",
)
"""Besides every ``__init__.py`` and the packages of :data:`NOT_COMPILED_PACKAGES` (see the module docstring)."""
NOT_COMPILED_PACKAGES = ("proxy/auth/", "proxy/credits/", "proxy/idempotency/", "proxy/rate_limits/", "proxy/stores/")
TIMED = ("added_p50_ms_c1", "floor_added_p50_ms_c1", "throughput_ratio_c64", "proxy_cpu_us_c64", "floor_cpu_us_c64",
         "stream_ttfb_added_ms")


def compiled_modules(root: Path) -> list[str]:
    """The ``proxy`` modules this benchmark compiles, relative to ``root``."""
    modules = []
    for path in sorted((root / "proxy").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if path.name in ("__init__.py", "__main__.py") or relative.startswith(NOT_COMPILED_PACKAGES):
            continue
        if relative not in NOT_COMPILED:
            modules.append(relative)
    return modules


def _bench(cwd: Path, *args: str) -> dict[str, float]:
    """The JSON figures of ``python -m loadtest.bench ARGS --json`` run on the packages under ``cwd``."""
    command = [sys.executable, "-m", "loadtest.bench", *args, "--json"]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench compiled")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timings", type=int, default=0, metavar="N",
                        help="also run the overhead benchmark N times in each tree, alternating")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("this benchmark needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    try:
        import mypyc  # noqa: F401  (comes with mypy)
    except ImportError:
        print("this benchmark needs mypyc (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ragproxy-compiled-") as temporary:
        copy = Path(temporary)
        for package in PACKAGES:
            shutil.copytree(ROOT / package, copy / package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
        shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
        modules = compiled_modules(copy)
        build = subprocess.run([sys.executable, "-m", "mypyc", *modules], cwd=copy, capture_output=True, text=True)
        if build.returncode != 0:
            print(build.stdout[-4000:], build.stderr[-4000:], sep="\n", file=sys.stderr)
            return 1
        instructions = ["instructions", *(["--quick"] if args.quick else [])]
        compiled = _bench(copy, *instructions)
        interpreted = _bench(ROOT, *instructions)
        runs: dict[str, list[dict[str, float]]] = {"compiled": [], "interpreted": []}
        for _ in range(args.timings):
            runs["compiled"].append(_bench(copy, "overhead", "--quick"))
            runs["interpreted"].append(_bench(ROOT, "overhead", "--quick"))
    results = {"modules_compiled": float(len(modules))}
    for name in ("proxy", "floor"):
        key = f"{name}_instructions_per_request"
        results[f"interpreted_{key}"] = interpreted[key]
        results[f"compiled_{key}"] = compiled[key]
        results[f"{name}_compiled_to_interpreted"] = compiled[key] / interpreted[key]
    for tree, figures in runs.items():
        for key in TIMED if figures else ():
            results[f"{tree}_{key}_median"] = statistics.median(run[key] for run in figures)
    for key, value in results.items():
        print(f"{key:44s} {value:14,.3f}")
    if args.json:
        print(json.dumps({key: round(value, 3) for key, value in results.items()}))
    return 0
