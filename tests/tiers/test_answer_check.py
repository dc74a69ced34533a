"""The answer check: past wording and the questions' own words, word weights learned from the upstream's answers."""

from __future__ import annotations

import pytest

from tiers.answer_check import MIN_ANSWERS, AnswerAgreement, answers_agree_exactly


def test_equal_texts_agree_up_to_whitespace_and_case() -> None:
    assert answers_agree_exactly("Paris  is the capital.", "paris is the capital.")
    assert not answers_agree_exactly("Paris", "Lyon")


def _answers(check: AnswerAgreement) -> None:
    """Stock phrases in every answer, one point each: what the check learns its word weights from."""
    for i in range(MIN_ANSWERS):
        check.learn(f"Great question! Here is what I think. Point {i}: consider the item number {i} carefully. "
                    "Hope this helps.")


def test_the_answer_check_looks_past_wording_and_the_questions_words() -> None:
    check = AnswerAgreement(0.4)
    assert not check.ready
    _answers(check)
    assert check.ready
    one = "Great question! You should compare interest rates and read the fine print. Hope this helps."
    reworded = "Hope this helps: read the fine print first, then compare the interest rates."
    other = "Great question! You should ask a mentor and keep a written plan. Hope this helps."
    assert check.agree(one, reworded, ("How do I pick a mortgage?", "Which mortgage should I take?"))
    assert not check.agree(one, other, ("How do I pick a mortgage?", "How do I pick a career?"))
    echo = "Picking a mortgage: picking a mortgage is about the mortgage you pick."
    assert check.similarity(echo, "A mortgage pick needs a mortgage.", ("How do I pick a mortgage?",)) == 0.0, \
        "only the questions' own words in common is no agreement"
    assert check.similarity(" Same  text ", "same text") == 1.0


def test_the_answer_check_forgets_old_answers_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiers.answer_check as answer_check

    monkeypatch.setattr(answer_check, "MAX_DOCUMENTS", 10)
    check = AnswerAgreement(0.4)
    for i in range(30):
        check.learn(f"word{i} common")
    assert len(check._documents) <= 10 + 2
