"""``ragproxy calibrate``: reading pairs, choosing a threshold, writing it into a config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from commands.calibrate import choose, prior_curve, write_thresholds
from commands.cli import main
from tiers.calibration import GRID
from tiers.labelled_pairs import LabelledPair, PairsError, half_of, read_pairs


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


def test_same_answer_labels_where_given_and_is_duplicate_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("question1,question2,is_duplicate,same_answer\nhow tall,what height,1,0\nwho,whom,0,1\n"
                    "when,what time,1,\n")
    assert [p.duplicate for p in read_pairs(path, labels="same_answer")] == [False, True, True]
    assert [p.duplicate for p in read_pairs(path)] == [True, False, True]
    (tmp_path / "old.csv").write_text("question1,question2,is_duplicate\na,b,1\n")
    with pytest.raises(PairsError, match="same_answer"):
        read_pairs(tmp_path / "old.csv", labels="same_answer")


def test_the_prior_curve_is_monotone_and_pools_its_thin_top() -> None:
    # 0.85: 10 of 40 wrong; 0.86: 20 of 40 wrong (a violation: pooled with 0.85); 0.95: 2 of 100; 0.99: 1 of 10
    scores = [0.855] * 40 + [0.865] * 40 + [0.955] * 100 + [0.995] * 10
    same = [i >= 10 for i in range(40)] + [i >= 20 for i in range(40)] + [i >= 2 for i in range(100)] + \
        [i >= 1 for i in range(10)]
    shares, pairs = prior_curve(scores, same)
    cell = GRID.index
    assert shares[cell(0.85)] == shares[cell(0.86)] == 0.375
    assert shares[cell(0.95)] == shares[cell(0.99)] == round(3 / 110, 3), "the top pools at least 100 pairs"
    assert pairs[cell(0.95)] == 100 and pairs[cell(0.99)] == 10 and pairs[cell(0.70)] == 0
    assert shares == sorted(shares, reverse=True)
