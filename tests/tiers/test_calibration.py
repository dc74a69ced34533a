"""The error-bound decision: the prior's shape, a namespace's own mix learned from answer comparisons, and a bound
that holds at every moment."""

from __future__ import annotations

import gc
import math
import random
import tracemalloc

import orjson
import pytest

from tiers.calibration import (
    GRID,
    NAMESPACE_BYTES,
    PRIOR_WRONG_SHARE,
    SERVE_FLOOR,
    UNREACHABLE,
    Calibrator,
    Evidence,
    cell_of,
    choose_threshold,
    upper_bound,
    wilson,
)
from tiers.semantic import answer_text


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _draw(theta: float, rng: random.Random) -> tuple[float, bool]:
    """One comparison of a namespace whose mix is ``theta``: a cell at random, agreeing as the model says."""
    cell = rng.randrange(len(GRID))
    offset = math.log((1 - PRIOR_WRONG_SHARE[cell]) / PRIOR_WRONG_SHARE[cell])
    return GRID[cell] + 0.005, rng.random() < _sigmoid(theta + offset)


def test_without_evidence_a_namespace_is_calibrating() -> None:
    threshold, share, bound = choose_threshold(0.05, None)
    assert (threshold, share, bound) == (UNREACHABLE, PRIOR_WRONG_SHARE[-1], 1.0)
    point = Calibrator(0.05).operating("faq")
    assert point.state == "calibrating" and point.as_dict()["state"] == "calibrating"
    assert tuple(sorted(PRIOR_WRONG_SHARE, reverse=True)) == PRIOR_WRONG_SHARE, "the shape never rises"


def test_comparisons_below_a_threshold_inform_it() -> None:
    """Near misses at 0.86-0.88 that agree teach the namespace that its hits at 0.93 are right too, with no comparison
    at 0.93 at all: the prior's shape ties the cells together."""
    evidence = Evidence()
    for i in range(150):
        evidence.add(0.86 + 0.01 * (i % 3), agreed=i % 25 != 0)
        evidence.look(0.86 + 0.01 * (i % 3))
    threshold, share, bound = choose_threshold(0.05, evidence)
    assert SERVE_FLOOR <= threshold <= 0.95
    assert evidence.observed_above(cell_of(0.90) or 0) == (0, 0)
    assert share < bound <= 0.05


def test_disagreements_raise_the_threshold_and_the_model_free_check_vetoes_a_cell() -> None:
    calibrator = Calibrator(0.05)
    for _ in range(200):
        calibrator.observe("faq", 0.90, agreed=True)
    lowered = calibrator.threshold("faq")
    assert lowered < UNREACHABLE
    for _ in range(60):
        calibrator.observe("faq", 0.97, agreed=False)
    assert calibrator.threshold("faq") == UNREACHABLE, "a third of the top cell disagrees: no cell is trusted"
    assert calibrator.threshold("other") == UNREACHABLE, "evidence stays in its namespace"


def test_the_bound_holds_at_every_moment_not_only_at_the_end() -> None:
    """A namespace whose true mix is the prior's (every cell's wrong share above 5%) must never be given a threshold
    at 5%, although the decision is taken again after every comparison: at most a few runs in 40 may ever slip."""
    slipped = 0
    for seed in range(40):
        rng = random.Random(seed)
        evidence = Evidence()
        for _ in range(300):
            score, agreed = _draw(0.0, rng)
            evidence.add(score, agreed)
            evidence.look(score)
            if choose_threshold(0.05, evidence)[0] < UNREACHABLE:
                slipped += 1
                break
    assert slipped <= 2


def test_the_mix_s_lower_bound_covers_the_true_mix_at_every_moment() -> None:
    """The confidence sequence itself: over whole runs of comparisons, re-bounded after every one, the bound ever
    passes the true mix in at most about 5% of runs (Ville's inequality), between grid points too."""
    for theta in (1.01, 2.5):
        passed = 0
        for seed in range(40):
            rng = random.Random(100 + seed)
            evidence = Evidence()
            for _ in range(200):
                evidence.add(*_draw(theta, rng))
                if evidence.theta_lower() > theta:
                    passed += 1
                    break
        assert passed <= 3, (theta, passed)


def test_the_bound_on_the_mix_is_within_a_few_tenths_after_hundreds_of_comparisons() -> None:
    """What the weighing of alternatives buys: after 600 comparisons of a namespace like the benchmark's (about 4.5
    times the prior's odds of needing the same answer), the bound sits under 0.39 below the most likely mix (a
    uniform weighing of every mix above, on a grid of 0.05, left 0.40-0.45)."""
    for seed in range(6):
        rng = random.Random(seed)
        evidence = Evidence()
        for _ in range(600):
            evidence.add(*_draw(1.5, rng))
        assert 0 < evidence.theta_estimate() - evidence.theta_lower() < 0.39


def test_a_clean_namespace_earns_a_threshold_from_a_few_dozen_comparisons() -> None:
    rng = random.Random(3)
    evidence = Evidence()
    earned = None
    for n in range(1, 400):
        score, agreed = _draw(3.0, rng)  # about 20 times the prior's odds of needing the same answer
        evidence.add(score, agreed)
        evidence.look(score)
        if choose_threshold(0.05, evidence)[0] < UNREACHABLE:
            earned = n
            break
    assert earned is not None and earned < 150


def test_the_served_share_weighs_cells_by_where_lookups_land() -> None:
    evidence = Evidence()
    for _ in range(9):
        evidence.look(0.99)
    evidence.look(0.90)
    assert evidence.served_share(0.0, cell_of(0.99) or 0) == pytest.approx(PRIOR_WRONG_SHARE[-1], rel=1e-3)
    assert evidence.served_share(0.0, cell_of(0.90) or 0) == pytest.approx(
        (9 * PRIOR_WRONG_SHARE[-1] + PRIOR_WRONG_SHARE[cell_of(0.90) or 0]) / 10, rel=1e-3)
    assert Evidence().served_share(0.0, 5) == pytest.approx(PRIOR_WRONG_SHARE[5], rel=1e-3), "no lookups: its cell"


def test_fixed_thresholds_override_the_bound() -> None:
    calibrator = Calibrator(0.05, fixed=0.8, namespace_fixed={"docs": 0.9})
    assert (calibrator.threshold("faq"), calibrator.threshold("docs")) == (0.8, 0.9)
    assert calibrator.operating("docs").state == "fixed"
    assert calibrator.report()["docs"]["estimated_wrong_hit_rate"] is None, "no estimate without an observation"
    calibrator.observe("docs", 0.93, agreed=True)
    assert calibrator.threshold("docs") == 0.9 and calibrator.operating("docs").observations == 1
    assert calibrator.operating("docs").estimated_wrong_hit_rate is not None


def test_verification_is_denser_while_comparisons_above_the_threshold_are_few() -> None:
    calibrator = Calibrator(0.05, verify_fraction=0.02, rng=random.Random(7))
    for _ in range(300):  # near misses below the floor: evidence, but none at or above the threshold
        calibrator.observe("faq", 0.80, agreed=True)
        calibrator.look("faq", 0.80)
    assert calibrator.operating("faq").state == "serving" and calibrator.operating("faq").checked == 0
    scarce = sum(calibrator.should_verify("faq") for _ in range(4000)) / 4000
    assert 0.08 < scarce < 0.12
    for _ in range(40):
        calibrator.observe("faq", 0.99, agreed=True)
    assert calibrator.operating("faq").checked >= 20
    assert sum(calibrator.should_verify("faq") for _ in range(4000)) / 4000 < 0.04
    assert not Calibrator(0.05, fixed=0.9).should_verify("faq")


def test_grid_cells() -> None:
    assert [cell_of(s) for s in (0.69, 0.70, 0.705, 0.99, 1.0)] == [None, 0, 0, 29, 29]


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


def test_wilson_bounds_are_sound_for_a_share_of_zero_and_few_trials() -> None:
    assert upper_bound(0.0, 2) > 0.5, "two clean trials prove little"
    assert upper_bound(0.0, 0) == 1.0
    assert 0.10 < upper_bound(0.10, 1000) < 0.12
    assert upper_bound(0.10, 100) > upper_bound(0.10, 1000)
    low, high = wilson(0.3, 50)
    assert low < 0.3 < high


def test_evidence_moves_its_own_tenants_threshold_only() -> None:
    """One tenant's comparisons cannot lower (or raise) another tenant's threshold in a namespace of the same name."""
    calibrator = Calibrator(0.10)
    for _ in range(200):
        calibrator.observe("default", 0.90, agreed=True, tenant="mallory")
    assert calibrator.threshold("default", "mallory") < UNREACHABLE
    assert calibrator.threshold("default", "alice") == calibrator.threshold("default") == UNREACHABLE
    assert calibrator.report()["mallory/default"]["observations"] == 200
    assert calibrator.report()["default"]["observations"] == 0


def test_namespaces_asked_about_hold_no_memory() -> None:
    """Clients name namespaces: asking about many without evidence keeps nothing per name."""
    calibrator = Calibrator(0.10)
    for i in range(1000):
        calibrator.threshold(f"ns{i}", tenant=f"t{i}")
        calibrator.should_verify(f"ns{i}", tenant=f"t{i}")
    assert len(calibrator.points()) == 1  # default


def _fill(calibrator: Calibrator, tenant: str, namespace: str) -> None:
    for score in (0.71, 0.8, 0.9, 0.95, 0.99):
        calibrator.look(namespace, score, tenant)
        calibrator.observe(namespace, score, score > 0.9, tenant)


def test_a_namespaces_evidence_holds_at_most_its_budgeted_bytes() -> None:
    """The ledger counts :data:`NAMESPACE_BYTES` a namespace: what one holds, names of 64 characters included, with
    counts too large for Python's shared small integers."""
    calibrator = Calibrator(0.05, max_bytes=10**9)
    gc.collect()
    tracemalloc.start()
    try:
        for n in range(300):
            tenant, namespace = f"tenant-{n % 5:0>57}", f"namespace-{n:0>54}"
            _fill(calibrator, tenant, namespace)
            for _ in range(300):
                calibrator.look(namespace, 0.95, tenant)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] / 300
    finally:
        tracemalloc.stop()
    assert 0.75 * NAMESPACE_BYTES <= measured <= NAMESPACE_BYTES
    [account] = calibrator.memory()
    assert (account.bytes, account.entries) == (300 * NAMESPACE_BYTES, 300)


def test_namespaces_beyond_the_budget_go_the_floods_own_first() -> None:
    budget = 30 * NAMESPACE_BYTES
    calibrator = Calibrator(0.10, max_bytes=budget)
    for n in range(10):
        _fill(calibrator, "alice", f"ns{n}")
    for n in range(300):
        _fill(calibrator, "mallory", f"flood{n}")
        assert calibrator.memory()[0].bytes <= budget
    report = calibrator.report()
    assert all(f"alice/ns{n}" in report for n in range(10))
    assert "mallory/flood299" in report and "mallory/flood0" not in report
    assert sum(name.startswith("mallory/") for name in report) == 20
