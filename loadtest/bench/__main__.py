"""``python -m loadtest.bench NAME [--quick] [--json]``: run one benchmark.

Each benchmark is a module ``loadtest.bench.<name>`` with ``main(argv: list[str]) -> int``. It prints its figures and
the ratio to a baseline measured in the same run; with ``--json`` its last output line is one JSON object.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import loadtest.bench as package


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not args or args[0] not in names:
        print(f"usage: python -m loadtest.bench {{{','.join(names)}}} [--quick] [--json]", file=sys.stderr)
        return 2
    module = importlib.import_module(f"loadtest.bench.{args[0]}")
    return int(module.main(args[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
