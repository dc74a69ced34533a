"""Template lines learnt per partition and left out of the compared question."""

from __future__ import annotations

from tiers.question_templates import WINDOW, QuestionTemplates


def templated(question: str) -> str:
    return f"Use the sources.\nSources:\n[1]\n[2]\nQuestion: {question}\nAnswer:"


def test_the_lines_a_namespaces_questions_repeat_are_dropped_from_the_second_on() -> None:
    templates = QuestionTemplates()
    assert templates.question("p", templated("why is the sky blue?")) == templated("why is the sky blue?").replace(
        "\n", " "), "one text: nothing is known to repeat"
    assert templates.question("p", templated("how do magnets work?")) == "Question: how do magnets work?"
    assert templates.question("other", templated("how do magnets work?")).startswith("Use the sources."), \
        "namespaces learn apart"


def test_a_repeated_question_is_not_taken_for_template_and_two_templates_are_both_learnt() -> None:
    templates = QuestionTemplates()
    for i in range(WINDOW):
        templates.question("p", templated(f"question number {i}?"))
    for _ in range(WINDOW):
        assert templates.question("p", templated("what is the refund policy?")) == \
            "Question: what is the refund policy?"
    other = "Context follows.\n[1]\nQ: {}"
    for i in range(WINDOW):
        learnt = templates.question("p", other.format(f"other question {i}?")) == f"Q: other question {i}?"
        assert learnt == (i >= 3), "a second template, learnt once a quarter of the recent texts carry it"
        assert templates.question("p", templated(f"question {i}?")) == f"Question: question {i}?"


def test_single_lines_stay_whole_and_namespaces_are_bounded() -> None:
    templates = QuestionTemplates(namespaces=2)
    assert templates.question("p", "what is RAG?") == "what is RAG?"
    for partition in ("a", "b", "c"):
        templates.question(partition, templated("x?"))
    assert set(templates._recent) == {"b", "c"}
