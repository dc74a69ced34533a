"""How far a namespace's calibration has come: comparisons, the threshold it serves at, and about how many more
agreeing comparisons a calibrating one needs; the log lines as it goes; the warm-up file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tiers.calibration import GRID, Calibrator, Evidence, choose_threshold
from tiers.calibration_file import load, save
from tiers.calibration_progress import MOST_NEEDED, ProgressBoard, progress


def test_a_calibrating_namespace_is_told_how_far_it_is_from_serving() -> None:
    calibrator = Calibrator(0.05)
    board = ProgressBoard(calibrator)
    first = board.of("docs", "acme")
    assert (first.comparisons, first.state, first.threshold) == (0, "calibrating", None)
    assert first.needs is not None and first.would_serve_at is not None and first.would_serve_at <= 1
    needs = first.needs
    for _ in range(needs):  # agreeing comparisons where the estimate assumed them: it was right
        calibrator.observe("docs", GRID[GRID.index(0.85)], True, "acme")
    now = board.of("docs", "acme")
    assert now.state == "serving" and now.threshold == first.would_serve_at
    assert now.summary() == f"{needs} comparisons ({needs} agreed); serving at threshold {now.threshold:g}"
    just_short = Evidence()
    for _ in range(needs - 1):
        just_short.add(0.85, True)
    assert choose_threshold(0.05, just_short)[0] > 1, "the fewest that serve, not more"


def test_disagreements_push_the_distance_out_and_then_out_of_reach() -> None:
    evidence = Evidence()
    for _ in range(10):
        evidence.add(0.9, True)
    near = progress(0.05, evidence, "calibrating", 1.01)
    for _ in range(10):
        evidence.add(0.9, False)
    further = progress(0.05, evidence, "calibrating", 1.01)
    assert near.needs is not None and further.needs is not None and further.needs > near.needs
    for _ in range(200):  # wrong even among the closest questions
        evidence.add(0.97, False)
    far = progress(0.05, evidence, "calibrating", 1.01)
    assert far.needs is None and far.agreed == 10
    assert f"within reach of {MOST_NEEDED}" in far.summary()


def test_the_report_carries_progress_and_fixed_or_serving_namespaces_need_nothing() -> None:
    calibrator = Calibrator(0.05, namespace_fixed={"pinned": 0.9})
    calibrator.observe("pinned", 0.93, True, "acme")
    rows = ProgressBoard(calibrator).report()
    assert rows["acme/pinned"]["summary"] == "1 comparison (1 agreed); fixed threshold 0.9"
    assert rows["acme/pinned"]["needs"] is None and rows["default"]["comparisons"] == 0
    assert isinstance(rows["default"]["needs"], int)


def test_log_lines_come_at_the_first_comparison_doublings_and_changes_of_state() -> None:
    calibrator = Calibrator(0.05)
    board = ProgressBoard(calibrator)
    logged = []
    for n in range(1, 70):
        calibrator.observe("docs", 0.9, True, "acme")
        if board.news("docs", "acme") is not None:
            logged.append((n, board.of("docs", "acme").state))
    counts = [n for n, _ in logged]
    assert counts[0] == 1 and len(logged) <= 7, logged
    assert any(state == "serving" for _, state in logged), "the change to serving is logged"
    assert {8, 16, 32, 64} & set(counts), "then at doublings"


def test_seeding_adds_evidence_and_the_file_round_trips(tmp_path: Path) -> None:
    evidence = Evidence()
    for _ in range(30):
        evidence.add(0.9, True)
    evidence.add(0.9, False)
    evidence.look(0.95)
    path = tmp_path / "warm.json"
    save(path, {("acme", "docs"): evidence})
    save(path, {("acme", "faq"): Evidence()})  # another namespace: the first kept
    rows = load(path)
    assert set(rows) == {("acme", "docs"), ("acme", "faq")} and rows[("acme", "docs")] == evidence
    calibrator = Calibrator(0.05)
    calibrator.observe("docs", 0.88, True, "acme")
    calibrator.seed("docs", "acme", rows[("acme", "docs")])
    seeded = calibrator.evidence_of("docs", "acme")
    assert seeded is not None and seeded.total == 32 and sum(seeded.disagreed) == 1
    assert calibrator.evidence_of("docs", "other") is None, "never another tenant's"
    data = orjson.loads(path.read_bytes())
    data["namespaces"][0]["disagreed"][0] = 99  # more disagreements than comparisons: the row is skipped
    data["namespaces"].append({"tenant": "x"})
    path.write_bytes(orjson.dumps(data))
    assert set(load(path)) == {("acme", "faq")}
    path.write_text("[]")
    with pytest.raises(ValueError, match="not a calibration file"):
        load(path)
