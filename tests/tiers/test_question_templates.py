"""Template lines learnt per partition and left out of the compared question."""

from __future__ import annotations

import gc
import tracemalloc

from tiers.question_templates import MAX_LINES, WINDOW, QuestionTemplates


def templated(question: str) -> str:
    return f"Use the sources.\nSources:\n[1]\n[2]\nQuestion: {question}\nAnswer:"


def test_the_lines_a_namespaces_questions_repeat_are_dropped_from_the_second_on() -> None:
    templates = QuestionTemplates()
    assert templates.question("p", templated("why is the sky blue?")) == templated("why is the sky blue?"), \
        "one text: nothing is known to repeat"
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


def distinct_lines(n: int) -> str:
    """A text of :data:`MAX_LINES` lines none other carries: a namespace at its largest."""
    return "\n".join(f"line {i} of text {n}: {n * MAX_LINES + i}" for i in range(MAX_LINES))


def test_single_lines_stay_whole_and_namespaces_are_bounded_in_bytes() -> None:
    one = QuestionTemplates()
    one.question("t\x1fa", templated("x?"))
    budget = 3 * one.memory()[0].bytes
    templates = QuestionTemplates(max_bytes=budget)
    assert templates.question("t\x1fp", "what is RAG?") == "what is RAG?"
    for partition in ("a", "b", "c", "d"):
        templates.question(f"t\x1f{partition}", templated("x?"))
    assert set(templates._recent) == {"t\x1fb", "t\x1fc", "t\x1fd"}
    assert templates.memory()[0].bytes <= budget


def test_the_ledger_figure_is_what_the_namespaces_hold() -> None:
    templates = QuestionTemplates(max_bytes=10**9)
    texts = [distinct_lines(n) for n in range(WINDOW * 50)]
    gc.collect()
    tracemalloc.start()
    try:
        for n, text in enumerate(texts):
            templates.question(f"tenant\x1fnamespace-{n // WINDOW}", text)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    [account] = templates.memory()
    assert account.entries == 50
    assert 0.9 <= account.bytes / measured <= 1.25, (account.bytes, measured)


def test_a_tenant_flooding_namespaces_forgets_its_own_first() -> None:
    templates = QuestionTemplates(max_bytes=2 * 1024 * 1024)
    for n in range(WINDOW):
        templates.question("alice\x1fapp", distinct_lines(n))
    for n in range(WINDOW * 200):
        templates.question(f"mallory\x1fns-{n // WINDOW}", distinct_lines(n))
        assert templates.memory()[0].bytes <= 2 * 1024 * 1024
    assert "alice\x1fapp" in templates._recent and "mallory\x1fns-0" not in templates._recent
