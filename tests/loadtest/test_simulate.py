"""Trace generators, trace files and the simulator's figures."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from loadtest.simulate import main
from loadtest.traces import GENERATORS, ONE_HIT_WONDER_TRACES, generate, one_hit_fraction
from tiers.policies import LRUPolicy
from tiers.policies.simulate import parse_capacity, replay
from tiers.policies.trace import TraceRecord, TraceRecorder, read_trace, working_set_bytes, write_trace


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_are_seeded_and_well_formed(name: str) -> None:
    first, again, other = generate(name, 3000, seed=7), generate(name, 3000, seed=7), generate(name, 3000, 8)
    assert first == again and first != other and len(first) == 3000
    assert all(r.size > 0 and r.cost > 0 for r in first)
    assert all(a.time <= b.time for a, b in itertools.pairwise(first))
    sizes: dict[str, tuple[int, float]] = {}
    for request in first:  # a key keeps its size and cost for the whole trace
        assert sizes.setdefault(request.key, (request.size, request.cost)) == (request.size, request.cost)


@pytest.mark.parametrize("name", ONE_HIT_WONDER_TRACES)
def test_one_hit_wonder_traces_have_50_to_80_percent_single_use_keys(name: str) -> None:
    assert 0.5 <= one_hit_fraction(generate(name, 20000, seed=1)) <= 0.8


def test_recorder_appends_lines_that_read_back(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with TraceRecorder(path) as recorder:
        recorder.record("a", 10, 1.5, 0.25)
    TraceRecorder(path).record("b", 20, 2.0, 0.5)  # flushed per record, another writer appends
    assert list(read_trace(path)) == [TraceRecord("a", 10, 1.5, 0.25), TraceRecord("b", 20, 2.0, 0.5)]
    assert json.loads(path.read_text().splitlines()[0]) == {"key": "a", "size": 10, "cost": 1.5, "time": 0.25}


def test_replay_counts_hits_bytes_and_cost() -> None:
    trace = [TraceRecord(key, 10, cost, time) for time, (key, cost) in
             enumerate([("a", 1), ("b", 2), ("a", 1), ("c", 4), ("b", 2), ("c", 4)])]
    result = replay(LRUPolicy(20), trace)  # hits: a (t=2), c (t=5); c evicts b, b evicts a
    assert result.hits == 2 and result.requests == 6
    assert result.object_hit_ratio == pytest.approx(2 / 6)
    assert result.byte_hit_ratio == pytest.approx(20 / 60)
    assert result.cost_saved_ratio == pytest.approx(5 / 14)


def test_capacity_is_bytes_or_share_of_working_set() -> None:
    assert parse_capacity("5%", 1000) == 50 and parse_capacity("4096", 1000) == 4096
    with pytest.raises(ValueError):
        parse_capacity("-1", 1000)
    assert working_set_bytes([TraceRecord("a", 10, 1, 0), TraceRecord("a", 10, 1, 1), TraceRecord("b", 5, 1, 2)]) == 15


def test_main_replays_a_file_and_reports_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("ohw80", 4000, seed=3))
    assert main([str(path), "--policy", "lru", "--policy", "bpcache", "--capacity", "5%", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["policy"] for r in report["results"]] == ["lru", "bpcache"]
    assert all(0 <= r["cost_saved_ratio"] <= 1 for r in report["results"])
    lru, bp = report["results"]
    assert bp["cost_saved_ratio"] > lru["cost_saved_ratio"]


def test_main_runs_a_generator_by_name_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zipf", "--requests", "2000", "--capacity", "10%", "--small-ratio", "0.2"]) == 0
    output = capsys.readouterr().out
    assert all(name in output for name in ("lru", "fifo", "s3fifo", "gdsf", "landlord", "bpcache"))


def test_main_rejects_unknown_traces_and_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-trace"]) == 2
    assert main(["zipf", "--requests", "100", "--policy", "mru"]) == 2
    assert "allowed" in capsys.readouterr().err
