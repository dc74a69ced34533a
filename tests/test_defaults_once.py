"""Every default is defined once: a literal default of a setting is not written again, as a literal under the same
name, in a signature, dataclass field or class attribute elsewhere in the product (a second definition drifts from
the first). Where a part of the product needs the same default, it reads it from the settings, or the settings read
it from the part (a constant both name)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "tiers", "normalizer", "admin")
SETTINGS = (*sorted(ROOT.glob("proxy/*/settings.py")), ROOT / "proxy/assembly/config.py",
            ROOT / "proxy/core/redis_settings.py")
COINCIDENCES = {("max_entries", 10_000), ("host", "127.0.0.1")}
"""Names and values a setting shares with something it does not configure: ``cache.stale.max_entries`` and the
in-process idempotency store's bound; ``server.host`` and the test doubles' bind address."""


def _literal(node: ast.expr | None) -> Any:
    """The value of a literal number or string (``None`` for anything else: booleans, 0 and 1 included)."""
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or node.value in (0, 1, ""):
        return None
    return node.value if isinstance(node.value, (int, float, str)) else None


def _settings_literals() -> set[tuple[str, Any]]:
    """(field, default) of every setting whose default is written as a literal in a settings module."""
    found: set[tuple[str, Any]] = set()
    for path in SETTINGS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
                value = next((keyword.value for keyword in value.keywords if keyword.arg == "default"), None)
            literal = _literal(value)
            if literal is not None:
                found.add((node.target.id, literal))
    return found


def _literal_defaults(tree: ast.AST) -> list[tuple[str, Any, int]]:
    """(name, value, line) of every parameter default, annotated class attribute or dataclass field given as a
    literal number or string."""
    found: list[tuple[str, Any, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
            pairs += [(arg, default)
                      for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default is not None]
            found += [(arg.arg, _literal(default), default.lineno) for arg, default in pairs]
        elif isinstance(node, ast.ClassDef):
            found += [(statement.target.id, _literal(statement.value), statement.lineno) for statement in node.body
                      if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)]
    return [(name, value, line) for name, value, line in found if value is not None]


def test_no_settings_default_is_defined_twice() -> None:
    settings = _settings_literals() - COINCIDENCES
    twice = [f"{path.relative_to(ROOT)}:{line} {name}={value!r}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")) if path not in SETTINGS
             for name, value, line in _literal_defaults(ast.parse(path.read_text(encoding="utf-8")))
             if (name, value) in settings]
    assert not twice, "defaults the settings already define:\n" + "\n".join(twice)
