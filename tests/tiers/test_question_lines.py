"""Two questions compared line by line: a line where they differ is never left out of the comparison."""

from __future__ import annotations

import numpy as np

from tiers.question_lines import diff_lines, lines_similarity

DOSE = "What is the paracetamol dose?"


def test_one_differing_line_each_compared_as_is_asks_nothing_more() -> None:
    diff = diff_lines("who wrote it", "who wrote it", "Tell me who wrote it?", "Tell me who wrote it?")
    assert (diff.veto, diff.texts, diff.weigh) == (None, ("who wrote it", "Tell me who wrote it?"), ((), ()))
    template = "Use the sources.\nQuestion: {}\nAnswer:"
    diff = diff_lines(
        template.format("who wrote it"),
        "Question: who wrote it",
        template.format("who is the author"),
        "Question: who is the author",
    )
    assert diff.veto is None and diff.weigh == ((), ()), "a template both carry, left out of both"


def test_a_qualifier_left_out_as_template_or_outweighed_by_a_shared_line_vetoes() -> None:
    child, adult = f"{DOSE}\nThe patient is a child.", f"{DOSE}\nThe patient is an adult."
    assert diff_lines(child, DOSE, adult, DOSE).veto == "lines: child not in the other question", (
        "both qualifier lines were template: the compared texts are equal"
    )
    assert diff_lines(child, child, adult, adult).veto is not None, "nothing template: the question line is shared"
    assert (
        diff_lines(f"{DOSE}\nThe patient has a penicillin allergy.", DOSE, DOSE, DOSE).veto
        == "lines: a line only one question carries"
    )
    year = diff_lines(f"{DOSE}\nGive the figure for 2010.", DOSE, f"{DOSE}\nGive the figure for 2024.", DOSE)
    assert year.veto is not None and year.texts == (
        f"{DOSE}\nGive the figure for 2010.",
        f"{DOSE}\nGive the figure for 2024.",
    ), "the guards see them"


def test_equal_lines_up_to_case_and_spacing_do_not_differ() -> None:
    diff = diff_lines(f"  {DOSE}\nTHE PATIENT IS A CHILD.", DOSE, f"{DOSE}\nThe patient is a child.", DOSE)
    assert (diff.veto, diff.weigh) == (None, ((), ()))


def test_lines_reworded_together_are_each_weighed_against_their_closest_counterpart() -> None:
    first = "How much flour goes into the bread?\nGive the amounts in metric units."
    second = "What amount of flour does the bread need?\nGive the amounts in imperial units."
    diff = diff_lines(first, first, second, second)
    assert diff.veto is None
    assert diff.weigh == (
        ("how much flour goes into the bread?", "give the amounts in metric units."),
        ("what amount of flour does the bread need?", "give the amounts in imperial units."),
    )
    flour, units = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    vectors = {
        "how much flour goes into the bread?": flour,
        "what amount of flour does the bread need?": flour,
        "give the amounts in metric units.": units,
        "give the amounts in imperial units.": np.array([0.0, 0.6, 0.8]),
    }
    assert lines_similarity(diff.weigh, vectors) == 0.6, "the least close line decides"
    assert lines_similarity(diff.weigh, {}) is None, "unweighed lines are not taken as alike"
