"""The kv benchmarks' sides: smg is found where pip puts it, and its absence costs one line, not the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.bench._kv_contextpilot import contextpilot_installed
from loadtest.bench._kv_servers import find_smg
from loadtest.bench._kv_sides import SIDES, chosen_sides


def test_a_missing_smg_is_said_in_one_line_and_the_other_sides_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAGPROXY_SMG", str(tmp_path / "no-smg"))
    assert find_smg() is None
    pilot = ["contextpilot"] if contextpilot_installed() else []
    assert chosen_sides(",".join(SIDES)) == ["direct", *pilot, "serve", "proxy", "preserve"]
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "smg" in line] == [lines[0]] and "smg not found" in lines[0]
    assert len(lines) == (1 if pilot else 2)  # a missing ContextPilot costs one line too


def test_smg_is_taken_where_it_is_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    smg = tmp_path / "smg"
    smg.write_text("#!/bin/sh\n")
    monkeypatch.setenv("RAGPROXY_SMG", str(smg))
    assert find_smg() == smg
    assert chosen_sides("smg") == ["direct", "smg", "proxy"]  # direct and proxy always run, in a fixed order


def test_an_unknown_side_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown sides: vllm"):
        chosen_sides("direct,vllm")
