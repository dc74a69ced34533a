"""``ragproxy calibrate``: reading pairs, choosing a threshold, writing it into a config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.calibrate import LabelledPair, PairsError, choose, half_of, read_pairs, write_thresholds
from proxy.cli import main


def test_the_lowest_threshold_within_the_target_and_its_recall() -> None:
    # 100 duplicates at 0.99; at 0.95 90 duplicates and 10 not; at 0.90 100 duplicates and 100 not
    scores = [0.99] * 100 + [0.95] * 100 + [0.90] * 200
    duplicate = [True] * 100 + [True] * 90 + [False] * 10 + [True] * 100 + [False] * 100
    loose = choose("docs", scores, duplicate, 0.10)
    assert (loose.threshold, loose.wrong_hit_rate, loose.recall) == (0.91, 0.05, 190 / 290)
    assert loose.wrong_hit_rate_bound is not None and 0.05 < loose.wrong_hit_rate_bound <= 0.10
    strict = choose("docs", scores, duplicate, 0.06)
    assert (strict.threshold, strict.wrong_hit_rate) == (0.96, 0.0), "5% observed, but its bound exceeds 6%"
    assert choose("docs", [0.99, 0.98], [True, True], 0.1).threshold is None, "two pairs prove nothing"


def test_pairs_are_read_and_split_deterministically(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("question1,question2,is_duplicate,namespace\nhow tall,what height,1,docs\nwho,when,0,\n")
    pairs = read_pairs(path, namespace="faq")
    assert pairs == [LabelledPair("how tall", "what height", True, "docs"), LabelledPair("who", "when", False, "faq")]
    assert [half_of(p) for p in pairs] == ["held-out", "calibration"]  # a pair's half never changes
    halves = [half_of(LabelledPair(f"q{i}", f"r{i}", True, "d")) for i in range(1000)]
    assert 450 < halves.count("calibration") < 550
    (tmp_path / "bad.csv").write_text("q1,q2\n")
    with pytest.raises(PairsError, match="missing column"):
        read_pairs(tmp_path / "bad.csv")


def test_thresholds_merge_into_a_config(tmp_path: Path) -> None:
    config = tmp_path / "ragproxy.yaml"
    config.write_text("server: {port: 9000}\ncache: {l2: {namespace_thresholds: {faq: 0.9}}}\n")
    write_thresholds(config, {"docs": 0.93})
    assert yaml.safe_load(config.read_text()) == {
        "server": {"port": 9000}, "cache": {"l2": {"namespace_thresholds": {"faq": 0.9, "docs": 0.93}}}}


def test_the_command_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "none.csv")]) == 2
    assert "ragproxy calibrate:" in capsys.readouterr().err
