"""Every default is written once: the value a setting defaults to is written as a constant (a literal or a constant
expression such as ``16 * 1024**2``) in at most one place in the product. That place is the setting's own field, or
a constant the field reads; a parameter default, class attribute, dataclass field or module constant elsewhere whose
name names the setting (the setting's name, or a word-aligned end of it, either way round: ``max_wait_s`` names
``queue_max_wait_s``, ``sqlite_synchronous`` names ``synchronous``) and holds the same value is a second definition,
which drifts from the first. Such a place reads the setting, a constant the setting reads, or takes the value as a
required argument.

The settings are read from the model itself (every key of the configuration reference, nested sections and the
sections of list and mapping entries included), so a default written through a constant is followed to the constant.
Booleans, ``None`` and the empty string are not compared (they say "off" or "none"); every number is, 0 and 1
included (``1.0`` seconds is a chosen default like any other).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import operator
import sys
import typing
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from proxy.assembly.config import Settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "tiers", "normalizer", "admin", "upstream_doubles", "commands")

_OPERATORS: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}


class _NotConstant(Exception):
    """The expression reads something other than constants."""


def _evaluate(node: ast.expr) -> Any:
    """The value of a constant expression: numbers and strings, arithmetic on them, ``Decimal("...")``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Decimal"
            and len(node.args) == 1 and not node.keywords):
        return Decimal(_evaluate(node.args[0]))
    raise _NotConstant


def _comparable(value: Any) -> Any:
    """``value`` as compared (a number as a Decimal, so ``30`` and ``30.0`` meet), or ``None`` if not compared."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float, Decimal)):
        number = Decimal(str(value))
        return number
    return None


def _constant(node: ast.expr | None) -> Any:
    """The comparable value of a constant expression (``Field(default=...)`` read through), or ``None``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Field"):
        node = next((keyword.value for keyword in node.keywords if keyword.arg == "default"), None)
    if node is None:
        return None
    try:
        return _comparable(_evaluate(node))
    except (_NotConstant, ArithmeticError, ValueError, TypeError):
        return None


def _words(name: str) -> tuple[str, ...]:
    """The words of a name, lower case, a leading ``default`` and a trailing unit ``s`` dropped."""
    words = tuple(word for word in name.lower().split("_") if word)
    if words[:1] == ("default",):
        words = words[1:]
    if words[-1:] == ("s",):
        words = words[:-1]
    return words


def _names_it(name: str, key: str) -> bool:
    """Whether ``name`` names the setting ``key``: its words are a word-aligned end of the key's words (a part's
    parameter drops the qualifiers of the section it serves: ``max_wait_s`` names ``routing.queue_max_wait_s``)."""
    words, setting = _words(name), _words(key.replace(".", "_").replace("*", ""))
    return bool(words) and setting[len(setting) - len(words):] == words


def _sections(model: type[BaseModel], prefix: str) -> Iterator[tuple[type[BaseModel], str]]:
    """Every settings section class under ``model`` with its key prefix (``*`` for a list or mapping entry)."""
    yield model, prefix
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        for inner in _models_in(field.annotation):
            star = "" if inner is field.annotation else ".*"
            yield from _sections(inner, f"{key}{star}.")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in _models_in(argument)]


Place = tuple[Path, str | None, str]
"""Where a constant is written: module, enclosing class (``None`` at module level or in a signature), name."""


def _read_constant(module: Path, section: str, field: str) -> Place | None:
    """The module constant a settings field's default names (``default=NEAR_TTL_S``), followed through an import."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    value: ast.expr | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == section:
            value = next((statement.value for statement in node.body if isinstance(statement, ast.AnnAssign)
                          and isinstance(statement.target, ast.Name) and statement.target.id == field), None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Field":
        value = next((keyword.value for keyword in value.keywords if keyword.arg == "default"), None)
    if not isinstance(value, ast.Name):
        return None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == value.id:
                    spec = importlib.util.find_spec(node.module)
                    origin = spec.origin if spec else None
                    return (Path(origin), None, alias.name) if origin else None
    return module, None, value.id


def _settings() -> dict[str, tuple[Any, set[Place]]]:
    """Key → (comparable default, the places that define it: the field, and the constant it reads) for every
    setting with a non-neutral default."""
    found: dict[str, tuple[Any, set[Place]]] = {}
    for model, prefix in _sections(Settings, ""):
        module = Path(inspect.getfile(sys.modules[model.__module__]))
        for name, field in model.model_fields.items():
            default = field.default
            if default is PydanticUndefined and field.default_factory is not None:
                default = field.default_factory()  # type: ignore[call-arg]
            value = _comparable(default)
            if value is not None:
                constant = _read_constant(module, model.__name__, name)
                places = {(module, model.__name__, name)} | ({constant} if constant else set())
                found[f"{prefix}{field.alias or name}"] = (value, places)
    return found


def _definitions(tree: ast.Module) -> Iterator[tuple[str, Any, int, str | None]]:
    """(name, comparable value, line, enclosing class) of every constant a module writes under a name: module and
    class assignments, dataclass and settings fields, parameter defaults (a function's local variables are not
    defaults)."""

    def targets(statement: ast.stmt) -> list[tuple[str, ast.expr | None]]:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            return [(statement.target.id, statement.value)]
        if isinstance(statement, ast.Assign):
            return [(target.id, statement.value) for target in statement.targets if isinstance(target, ast.Name)]
        return []

    def visit(body: list[ast.stmt], owner: str | None,
              local: bool = False) -> Iterator[tuple[str, Any, int, str | None]]:
        for statement in body:
            for name, value in [] if local else targets(statement):
                yield name, _constant(value), statement.lineno, owner
            if isinstance(statement, ast.ClassDef):
                yield from visit(statement.body, statement.name)
                continue
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = statement.args
                positional = args.posonlyargs + args.args
                pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
                pairs += [(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                          if default is not None]
                for arg, default in pairs:
                    yield arg.arg, _constant(default), default.lineno, owner
                yield from visit(statement.body, None, local=True)
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list):
                    yield from visit([item for item in inner if isinstance(item, ast.stmt)]
                                     + [stmt for handler in inner if isinstance(handler, ast.ExceptHandler)
                                        for stmt in handler.body], owner, local)

    yield from visit(tree.body, None)


def _written_twice() -> dict[str, list[str]]:
    """Key → ``path name=value`` of each place that writes its default, for every default written more than once."""
    settings = _settings()
    owned = {place for _, places in settings.values() for place in places}
    written: dict[str, list[str]] = {key: [] for key in settings}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, value, _, owner in _definitions(ast.parse(path.read_text(encoding="utf-8"))):
                place = (path, owner, name)
                for key, (default, places) in settings.items():
                    if value is not None and value == default and (
                            place in places or (place not in owned and _names_it(name, key))):
                        written[key].append(f"{path.relative_to(ROOT)} {name}={value}")
    return {key: places for key, places in written.items() if len(places) > 1}


def test_every_settings_default_is_written_once() -> None:
    twice = _written_twice()
    assert not twice, "settings defaults written in more than one place:\n" + "\n".join(
        f"{key}: {', '.join(places)}" for key, places in twice.items())


def test_constant_expressions_are_evaluated() -> None:
    tree = ast.parse("A = 16 * 1024**2\nB = -2.5\nC = Decimal('0.1')\ndef f(x=256 * 1024 * 1024, y=q): ...\n")
    found = {(name, value) for name, value, _, _ in _definitions(tree)}
    assert found == {("A", Decimal(16 * 1024**2)), ("B", Decimal("-2.5")), ("C", Decimal("0.1")),
                     ("x", Decimal(256 * 1024**2)), ("y", None)}


def test_names_match_word_aligned_ends_of_the_key() -> None:
    assert _names_it("max_wait_s", "routing.queue_max_wait_s")
    assert _names_it("synchronous", "credits.sqlite_synchronous")
    assert _names_it("ttl", "cache.l1.ttl_s")
    assert _names_it("DEFAULT_MAX_BYTES", "idempotency.max_bytes")
    assert _names_it("IDEMPOTENCY_MAX_BYTES", "idempotency.max_bytes")
    assert not _names_it("rerank_documents", "routing.documents")
    assert not _names_it("wait_s", "routing.queue_max_await_s")
    assert not _names_it("max_bytes", "idempotency.max_bytes_per_user")


def test_a_default_in_a_signature_is_found() -> None:
    tree = ast.parse("class Store:\n    def __init__(self, *, max_entries_per_user: int = 1_000) -> None: ...\n")
    assert ("max_entries_per_user", Decimal(1000), 2, "Store") in list(_definitions(tree))
