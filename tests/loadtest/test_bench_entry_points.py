"""Every benchmark BENCHMARKS.md names still starts: a move elsewhere in the tree cannot silently break one.

The scenarios come from BENCHMARKS.md (every ``python -m loadtest.bench NAME`` in it) and must equal the bench
registry (:func:`loadtest.bench.__main__.available`), so a new scenario is covered as soon as it is documented.
Each runs through ``python -m loadtest.bench`` in its smallest form where that takes seconds (``SMALLEST``), and
otherwise parses ``--help`` (which imports its module). Imports made inside functions escape both, so every
first-party import anywhere in ``loadtest/``, lazy ones included, is also resolved.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench.__main__ import available
from loadtest.responses import DEFAULT_QUESTIONS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = sorted(set(re.findall(r"python -m loadtest\.bench ([a-z0-9_]+)",
                                   (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))))

# The smallest form of each scenario that runs in a few seconds without external data, a server build or valgrind;
# the others (minutes, llama-server, valgrind, a labelled-pairs file) parse --help only.
SMALLEST: dict[str, list[str]] = {
    "policies": ["--quick", "--requests", "400"],
    "routing": ["--quick", "--replicas", "2", "--per-replica", "5"],
    "retrieval": ["--quick", "--passages", "10", "--distinct", "2", "--requests", "10"],
    "semantic": ["--quick", "--questions", "5"],
    "l1": ["--quick"],
}
NEEDS_NQ_OPEN = {"retrieval", "semantic"}
"""Scenarios whose questions are NQ-open's, read from ``../shared/data`` beside the checkout: --help only without it."""


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadtest.bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_the_documented_scenarios_are_the_registered_ones() -> None:
    assert available() == DOCUMENTED
    assert set(SMALLEST) <= set(DOCUMENTED)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_each_scenario_runs_or_parses_its_arguments(name: str) -> None:
    if name in SMALLEST and (name not in NEEDS_NQ_OPEN or DEFAULT_QUESTIONS.exists()):
        result = _bench(name, *SMALLEST[name], "--json", timeout=300)  # a failure bound only
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        assert isinstance(json.loads(result.stdout.strip().splitlines()[-1]), dict)
    else:
        result = _bench(name, "--help", timeout=60)
        assert result.returncode == 0, result.stderr[-4000:]
        assert result.stdout.startswith(f"usage: python -m loadtest.bench {name}")


RESOLVE = """
import ast, importlib, importlib.util, pathlib, sys
FIRST_PARTY = {"proxy", "tiers", "normalizer", "admin", "upstream_doubles", "commands", "loadtest", "tests"}
missing = []
for path in sorted(pathlib.Path("loadtest").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            wanted = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            wanted = [(alias.name, None) for alias in node.names]
        else:
            continue
        for module, name in wanted:
            if module.split(".")[0] not in FIRST_PARTY:
                continue
            try:
                found = importlib.import_module(module)
            except ImportError as error:
                missing.append(f"{path}:{node.lineno}: {module} ({error})")
                continue
            if name and not hasattr(found, name) and importlib.util.find_spec(f"{module}.{name}") is None:
                missing.append(f"{path}:{node.lineno}: {name} from {module}")
print("\\n".join(missing))
sys.exit(1 if missing else 0)
"""


def test_every_first_party_import_in_loadtest_resolves() -> None:
    """In a child process: some of these modules import Locust, which patches the standard library on import."""
    result = subprocess.run([sys.executable, "-c", RESOLVE], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
