"""The error-bound decision: thresholds from the prior curve and a namespace's own answer comparisons."""

from __future__ import annotations

import random

import orjson
import pytest

from tiers.calibration import (
    GRID,
    PRIOR_WEIGHT,
    PRIOR_WRONG_SHARE,
    UNREACHABLE,
    Calibrator,
    Evidence,
    answers_agree_exactly,
    bounds,
    cell_of,
    choose_threshold,
    estimates,
    upper_bound,
)
from tiers.semantic import answer_text


def test_without_evidence_the_prior_decides_through_its_upper_bound() -> None:
    uppers = bounds(None)
    assert all(upper > share for upper, share in zip(uppers, PRIOR_WRONG_SHARE, strict=True))
    cell = next(i for i, upper in enumerate(uppers) if upper <= 0.25)
    assert choose_threshold(0.25, None) == pytest.approx((GRID[cell], PRIOR_WRONG_SHARE[cell], uppers[cell]))
    assert PRIOR_WRONG_SHARE[cell - 1] <= 0.25, "the point estimate alone would have gone lower"
    threshold, share, _ = choose_threshold(0.05, None)
    assert threshold == UNREACHABLE and share == pytest.approx(PRIOR_WRONG_SHARE[-1]), "no prior point meets 5%"


def test_thin_evidence_above_the_threshold_cannot_lower_it() -> None:
    """A few agreeing verifications above a threshold move the point estimate under the target, not the bound."""
    thin, enough = Evidence(), Evidence()
    for _ in range(10):
        thin.add(0.95, agreed=True)
    for _ in range(150):
        enough.add(0.95, agreed=True)
    assert estimates(thin)[GRID.index(0.95)] < 0.10 < bounds(thin)[GRID.index(0.95)]
    assert choose_threshold(0.10, thin)[0] > 0.95
    assert choose_threshold(0.10, enough)[0] == 0.95


def test_agreeing_answers_lower_the_threshold_and_disagreeing_ones_raise_it() -> None:
    calibrator = Calibrator(0.05)
    assert calibrator.threshold("faq") == UNREACHABLE
    for _ in range(200):
        calibrator.observe("faq", 0.86, agreed=True)
    assert calibrator.threshold("faq") == 0.86
    operating = calibrator.operating("faq")
    assert operating.estimated_wrong_hit_rate == pytest.approx(
        PRIOR_WEIGHT * PRIOR_WRONG_SHARE[GRID.index(0.86)] / (PRIOR_WEIGHT + 200))
    assert operating.estimated_wrong_hit_rate < operating.wrong_hit_rate_bound <= 0.05  # type: ignore[operator]
    for _ in range(30):
        calibrator.observe("faq", 0.86, agreed=False)
    assert calibrator.threshold("faq") == UNREACHABLE, "above 0.86 nothing was observed and the prior is too high"
    for _ in range(150):
        calibrator.observe("faq", 0.93, agreed=True)
    assert calibrator.threshold("faq") == 0.93
    assert calibrator.threshold("other") == UNREACHABLE, "evidence stays in its namespace"


def test_estimates_are_cumulative_from_the_top() -> None:
    evidence = Evidence()
    evidence.add(0.955, agreed=False)
    evidence.add(0.6, agreed=False)  # below the grid: ignored
    shares = estimates(evidence, prior=tuple(0.0 for _ in GRID), weight=1.0)
    assert shares[GRID.index(0.95)] == 0.5 and shares[GRID.index(0.70)] == 0.5 and shares[GRID.index(0.96)] == 0.0
    assert evidence.total == 1


def test_fixed_thresholds_override_the_bound() -> None:
    calibrator = Calibrator(0.05, fixed=0.8, namespace_fixed={"docs": 0.9})
    assert (calibrator.threshold("faq"), calibrator.threshold("docs")) == (0.8, 0.9)
    assert calibrator.operating("docs").source == "fixed"
    assert calibrator.report()["docs"]["estimated_wrong_hit_rate"] == round(PRIOR_WRONG_SHARE[GRID.index(0.9)], 4)


def test_verification_is_sampled_at_the_configured_rate() -> None:
    calibrator = Calibrator(0.05, verify_fraction=0.25, rng=random.Random(7))
    share = sum(calibrator.should_verify() for _ in range(4000)) / 4000
    assert 0.22 < share < 0.28
    assert not Calibrator(0.05).should_verify()


def test_grid_cells() -> None:
    assert [cell_of(s) for s in (0.69, 0.70, 0.705, 0.99, 1.0)] == [None, 0, 0, 29, 29]
    assert answers_agree_exactly("Paris  is the capital.", "paris is the capital.")
    assert not answers_agree_exactly("Paris", "Lyon")


def test_answer_text_reads_chat_completions_and_responses_objects() -> None:
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}}]}
    response = {"object": "response", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "Par"}, {"type": "output_text", "text": "is."},
                                        {"type": "refusal", "refusal": "no"}]}]}
    assert answer_text(orjson.dumps(chat)) == "Paris."
    assert answer_text(orjson.dumps(response)) == "Paris."
    assert answer_text(b"data: not json") is None and answer_text(b"[1]") is None
    assert answer_text(orjson.dumps({"choices": [{"message": {"content": None}}]})) is None


def test_the_bound_is_sound_for_a_share_of_zero_and_few_trials() -> None:
    assert upper_bound(0.0, 2) > 0.5, "two clean trials prove little"
    assert upper_bound(0.0, 0) == 1.0
    assert 0.10 < upper_bound(0.10, 1000) < 0.12
    assert upper_bound(0.10, 100) > upper_bound(0.10, 1000)


def test_evidence_moves_its_own_tenants_threshold_only() -> None:
    """One tenant's comparisons cannot lower (or raise) another tenant's threshold in a namespace of the same name."""
    calibrator = Calibrator(0.10)
    for _ in range(200):
        calibrator.observe("default", 0.86, agreed=True, tenant="mallory")
    assert calibrator.threshold("default", "mallory") == 0.86
    assert calibrator.threshold("default", "alice") == calibrator.threshold("default") == UNREACHABLE
    assert calibrator.report()["mallory/default"]["observations"] == 200
    assert calibrator.report()["default"]["observations"] == 0


def test_namespaces_asked_about_hold_no_memory() -> None:
    """Clients name namespaces: asking about many without evidence keeps nothing per name."""
    calibrator = Calibrator(0.10)
    for i in range(1000):
        calibrator.threshold(f"ns{i}", tenant=f"t{i}")
    assert len(calibrator.points()) == 1  # default
