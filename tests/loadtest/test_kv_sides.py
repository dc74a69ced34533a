"""The kv benchmarks' sides: smg is found where pip puts it, and its absence costs one line, not the run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtest.bench import kv_load
from loadtest.bench._kv_contextpilot import contextpilot_installed
from loadtest.bench._kv_servers import find_smg
from loadtest.bench._kv_sides import SIDES, add_server_options, chosen_sides


def test_a_missing_smg_is_said_in_one_line_and_the_other_sides_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAGPROXY_SMG", str(tmp_path / "no-smg"))
    assert find_smg() is None
    pilot = ["contextpilot"] if contextpilot_installed() else []
    assert chosen_sides(",".join(SIDES)) == ["direct", *pilot, "serve", "fleet", "proxy", "preserve"]
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


def test_the_fleet_brings_the_one_proxy_it_is_compared_with_and_runs_only_when_asked() -> None:
    assert chosen_sides("fleet") == ["direct", "serve", "fleet", "proxy"]
    parser = argparse.ArgumentParser()
    add_server_options(parser)
    args = parser.parse_args([])
    assert "fleet" not in args.sides.split(",") and "serve" in args.sides.split(",")
    assert parser.parse_args(["--sides", "fleet", "--proxies", "2"]).proxies == 2


def test_a_fleet_without_redis_server_is_said_in_one_line_and_the_other_sides_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert chosen_sides("fleet") == ["direct", "proxy"]
    assert capsys.readouterr().out == "redis-server not found on the PATH: running without the fleet side\n"


def _trials(within: dict[float, int]) -> dict[float, list[tuple[int, int]]]:
    """Three repeats of 20 requests per rate, ``within[rate]`` of each answered within the objective."""
    return {rate: [(count, 20)] * 3 for rate, count in within.items()}


def test_the_load_bench_reports_the_fleet_capacity_against_one_proxy_with_its_interval() -> None:
    args = argparse.Namespace(target=0.9, resamples=200, seed=1, proxies=3)
    one = {1.0: 20, 2.0: 19, 4.0: 10, 8.0: 2}
    trials = {"direct": _trials(one), "proxy": _trials(one), "serve": _trials(one),
              "fleet": _trials({1.0: 20, 2.0: 20, 4.0: 19, 8.0: 6})}
    summary = kv_load._capacity(args, trials, 3)
    assert summary["proxies"] == 3
    ratio, interval = summary["capacity_ratio_vs_one_proxy"], summary["capacity_ratio_vs_one_proxy_ci"]
    assert isinstance(ratio, float) and ratio > 1.5  # the fleet holds the objective to a higher rate
    assert isinstance(interval, list) and interval[0] <= ratio <= interval[1]
    assert summary["capacity_ratio_vs_one_proxy_censored"] is False
    without = kv_load._capacity(args, {name: trials[name] for name in ("direct", "proxy", "serve")}, 3)
    assert "capacity_ratio_vs_one_proxy" not in without
