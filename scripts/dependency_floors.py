"""Print ``name==floor`` for each named requirement of pyproject.toml (its ``>=`` bound, dev extra included), for
installing the lowest versions the project claims to work with: ``pip install $(python scripts/dependency_floors.py
openai httpx)``. CI runs the SDK contract tests at these floors (``.ci/run``)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def floors(names: list[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    found = {}
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", requirement.replace(" ", ""))
        if match:
            found[match[1].lower()] = match[2]
    missing = [name for name in names if name.lower() not in found]
    if missing:
        raise SystemExit(f"no >= floor in pyproject.toml for: {', '.join(missing)}")
    return [f"{name}=={found[name.lower()]}" for name in names]


if __name__ == "__main__":
    print(" ".join(floors(sys.argv[1:])))
