"""Query-text normalization: each step, the default set, ordering and configuration."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.fold_pairs import KEEPS_MEANING, MEANING_CHANGES
from normalizer.text import DEFAULT_STEPS, STEPS, TextNormalizer, fold_question

normalize_text = TextNormalizer()
"""The default configuration, as the proxy builds it."""


@pytest.mark.parametrize(
    ("step", "text", "expected"),
    [
        ("nfkc", "\uff21\uff22\uff23 \ufb01ne x\u00b2", "ABC fine x2"),
        ("lowercase", "Straße IS Big", "strasse is big"),
        (
            "contractions",
            "Don\u2019t you know what's new? I can't, it won't.",
            "Do not you know what is new? I can not, it will not.",
        ),
        ("contractions", "John's car isn't here; they're gone", "John's car is not here; they are gone"),
        ("contractions", "I cannot", "I can not"),
        ("punctuation", "what? e-mail: C#!", "what  e mail  C# "),
        ("punctuation", "pi is 3.14, not 3,500 or 1:2", "pi is 3.14  not 3,500 or 1:2"),
        ("punctuation", "costs $5 + 10% at AT&T", "costs $5 + 10% at AT&T"),
        ("whitespace", "  a \t b\n\nc  ", "a b c"),
        ("stopwords", "what is the capital of France", "what capital France"),
        ("stopwords", "is it not true", "not true"),
        ("sort_words", "dog bites man", "bites dog man"),
    ],
)
def test_each_step(step: str, text: str, expected: str) -> None:
    assert STEPS[step](text) == expected


def test_default_steps_merge_trivial_variants() -> None:
    variants = [
        "What's the capital of France?",
        "what is the capital of france",
        "  WHAT IS the capital of France!! ",
    ]
    assert len({normalize_text(v) for v in variants}) == 1


def test_default_steps_keep_meaning_changing_differences() -> None:
    assert normalize_text("dog bites man") != normalize_text("man bites dog")
    assert normalize_text("capital of France") != normalize_text("capital France")
    assert normalize_text("3.5 miles") != normalize_text("35 miles")
    assert normalize_text("is it true") != normalize_text("isn't it true")


def test_lossy_steps_are_off_by_default() -> None:
    assert "stopwords" not in DEFAULT_STEPS and "sort_words" not in DEFAULT_STEPS


def test_steps_run_in_fixed_order_whatever_the_configuration_order() -> None:
    normalizer = TextNormalizer(["whitespace", "punctuation", "contractions", "lowercase"])
    assert normalizer.steps == ("lowercase", "contractions", "punctuation", "whitespace")
    assert normalizer("Don't GO!") == "do not go"


def test_unknown_step_is_refused() -> None:
    with pytest.raises(ValueError, match="stemming"):
        TextNormalizer(["lowercase", "stemming"])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_default_normalization_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


# -- the question as the exact key holds it -------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [
    "What is the capital of France?", "What is the capital of France", "  What is the capital of France?  ",
    "What  is the\tcapital of France", "What is the capital\u00a0of France?",
])
def test_variants_that_keep_the_meaning_fold_into_one_question(variant: str) -> None:
    assert fold_question(variant) == "What is the capital of France"


def test_canonically_equivalent_unicode_folds() -> None:
    composed, decomposed = "Who founded the caf\u00e9 chain?", "Who founded the cafe\u0301 chain?"
    assert fold_question(composed) == fold_question(decomposed)


def test_typographic_apostrophes_are_apostrophes() -> None:
    assert fold_question("What\u2019s a proxy?") == fold_question("What's a proxy") == "What's a proxy"




@pytest.mark.parametrize(("one", "other"), MEANING_CHANGES)
def test_what_can_change_the_answer_stays_apart(one: str, other: str) -> None:
    assert fold_question(one) != fold_question(other)


@pytest.mark.parametrize("marks", ["What is the capital of France??", "What is the capital of France ?",
                                   "What is the capital of France?!"])
def test_only_a_single_question_mark_after_a_word_is_folded(marks: str) -> None:
    assert fold_question(marks) == marks, "a run of marks, or one apart, may be an operator: kept as written"


def test_code_keeps_its_inner_whitespace_and_case() -> None:
    code = "def f(x):\n    return X  "
    assert fold_question(code) == code.strip()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_folding_is_idempotent(text: str) -> None:
    once = fold_question(text)
    assert fold_question(once) == once


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd", "Zs")), max_size=40),
       st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=8))
def test_a_quoted_span_is_never_folded_into_another(text: str, quoted: str) -> None:
    other = quoted.swapcase()
    if other != quoted:
        assert fold_question(f'{text} "{quoted}"') != fold_question(f'{text} "{other}"')


@pytest.mark.parametrize(("one", "other"), KEEPS_MEANING)
def test_what_cannot_change_the_answer_shares_a_key(one: str, other: str) -> None:
    assert fold_question(one) == fold_question(other)
