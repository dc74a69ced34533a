"""The Dockerfile runs the README's install steps, as a multi-stage, slim, non-root build.

No Docker engine runs here, so the image is never built by these tests. Verified instead: the install commands
of the README's setup step 1 appear verbatim, in order, as one ``RUN`` of the build stage (so CI, which runs
the README's path, tests the image's install path too); the stages use a slim Python 3.11 base; the runtime
stage runs as a numeric non-root user with ``ragproxy`` on ``PATH``; every ``COPY`` source exists and is let
through by .dockerignore; every package pyproject.toml installs is copied. Not verified: that the build
succeeds (network, compilers) or that the image starts.
"""

from __future__ import annotations

import re
import tomllib

from tests.charts.chart_source import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def readme_step_one() -> list[str]:
    """The commands of the README's setup step 1, split at ``&&``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Setup", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    step = lines[lines.index(next(line for line in lines if line.startswith("# 1."))) + 1]
    return [" ".join(command.split()) for command in step.split("&&")]


def test_install_commands_match_readme() -> None:
    commands = readme_step_one()
    install = [c for c in commands if not c.startswith(".venv/bin/ragproxy")]
    assert install[:2] == ["python3 -m venv .venv", ".venv/bin/pip install -e ."]  # the README's core steps
    build = stages()[0]
    runs = [[" ".join(c.split()) for c in args.split("&&")] for word, args in build if word == "RUN"]
    assert install in runs, f"no RUN in the build stage is exactly {install}"
    served = next(c for c in commands if c.startswith(".venv/bin/ragproxy"))
    assert served.split()[1] == "serve"


def test_multi_stage_slim_python_311() -> None:
    args = dict(a.partition("=")[::2] for word, a in instructions() if word == "ARG")
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    froms = [args for word, args in instructions() if word == "FROM"]
    assert len(froms) >= 2
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    assert any("--from=build" in args for word, args in stages()[-1] if word == "COPY")


def test_runtime_is_non_root_and_runs_ragproxy() -> None:
    runtime = stages()[-1]
    users = [args for word, args in runtime if word == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot can check it)"
    env = " ".join(args for word, args in runtime if word == "ENV")
    assert "PATH=/app/.venv/bin:$PATH" in env
    assert "RAGPROXY_" not in env, "RAGPROXY_* in the image would override the chart's config file"
    assert ("WORKDIR", "/app") in runtime
    assert ("ENTRYPOINT", '["ragproxy"]') in runtime
    cmd = next(args for word, args in runtime if word == "CMD")
    assert cmd.startswith('["serve"')


def test_copy_sources_exist_and_are_not_ignored() -> None:
    allowed = {line.strip()[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip().startswith("!")}
    sources = []
    for word, args in stages()[0]:
        if word == "COPY" and "--from" not in args:
            sources += args.split()[:-1]
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source in allowed, f"{source} is excluded by .dockerignore"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= set(sources), f"packages installed but not copied: {packages - set(sources)}"
    assert {"pyproject.toml", "README.md"} <= set(sources)
