"""Guards that veto semantic matches: each guard on its own, then the switchable veto."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normalizer.guards import DEFAULT_GUARDS, GUARDS, veto

# (guard, a, b, vetoed)
CASES = [
    ("numbers", "who won the world cup in 1998", "who won the world cup in 2002", True),
    ("numbers", "what is 1,000 plus two", "what is 1000 plus 2", False),
    ("numbers", "is 3.50 more than three", "is 3.5 more than 3", False),
    ("numbers", "who was the first president", "who was the second president", True),
    ("numbers", "top 10 movies", "top ten movies", False),
    ("numbers", "what is 2 + 2", "what is 2", True),
    ("numbers", "half a cup of sugar", "0.5 cup of sugar", False),
    ("numbers", "half a cup of sugar", "a quarter cup of sugar", True),
    ("numbers", "how do I bake bread", "what is the way to bake bread", False),
    ("quantities", "how far is 5 km", "how far is 5 miles", True),
    ("quantities", "it costs $20", "it costs 20 dollars", False),
    ("quantities", "it costs $20", "it costs 20 euros", True),
    ("quantities", "what is 20 percent of 50", "what is 20% of 50", False),
    ("quantities", "what is 20% of 50", "what is 20 of 50", True),
    ("units", "how tall is the tower in feet", "how tall is the tower in meters", True),
    ("units", "how tall is the tower in feet", "what is the height of the tower in ft", False),
    ("units", "temperature in celsius", "temperature in fahrenheit", True),
    ("dates", "what happened on May 5", "what happened on June 5", True),
    ("dates", "may I ask a question", "can I ask a question", False),
    ("dates", "NASA in the 1960s", "NASA in the 1970s", True),
    ("dates", "what is the weather today", "what is the weather tomorrow", True),
    ("dates", "sales last year", "sales next year", True),
    ("dates", "released on 2020-01-02", "released on 2020-01-03", True),
    ("dates", "what is on Monday", "what happens on monday", False),
    ("negations", "is paris the capital of france", "is paris not the capital of france", True),
    ("negations", "isn't it true", "is it not true", False),
    ("negations", "recipes with sugar", "recipes without sugar", True),
    ("negations", "can I do it", "I cannot do it", True),
    ("negations", "why do cats purr", "what makes cats purr", False),
    ("quoted", 'what does "carpe diem" mean', 'what does "memento mori" mean', True),
    ("quoted", 'what does "carpe diem" mean', "what does carpe diem mean", False),
    ("quoted", "define \u201cserendipity\u201d", "what is the meaning of serendipity", False),
    ("quoted", "grep for 'foo'", "grep for 'bar'", True),
    ("quoted", "don't stop", "do not stop", False),
    ("entities", "What is the capital of France?", "What is the capital of Spain?", True),
    ("entities", "What is the capital of France?", "what is the capital of france", False),
    ("entities", "Who founded Apple?", "who founded apple", False),
    ("entities", "is the iPhone waterproof", "is the Pixel waterproof", True),
    ("entities", "what does NASA do", "what does ESA do", True),
    ("entities", "Tell me about dogs", "Explain dogs", False),
]


@pytest.mark.parametrize(("guard", "a", "b", "vetoed"), CASES, ids=[f"{g}:{a}|{b}" for g, a, b, _ in CASES])
def test_guard_cases(guard: str, a: str, b: str, vetoed: bool) -> None:
    reason = GUARDS[guard](a, b)
    assert (reason is not None) is vetoed, reason
    assert (GUARDS[guard](b, a) is not None) is vetoed  # symmetric


def test_veto_reports_the_first_enabled_guard() -> None:
    a, b = "recipes with 2 eggs", "recipes without 3 eggs"
    assert str(veto(a, b)).startswith("numbers: ")
    assert str(veto(a, b, ["negations"])).startswith("negations: ")
    assert veto(a, b, []) is None


def test_unknown_guard_is_refused() -> None:
    with pytest.raises(ValueError, match="spelling"):
        veto("a", "b", ["numbers", "spelling"])


def test_all_guards_are_on_by_default() -> None:
    assert set(DEFAULT_GUARDS) == set(GUARDS)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_a_question_never_vetoes_itself(text: str) -> None:
    assert veto(text, text) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_every_guard_is_symmetric(a: str, b: str) -> None:
    for guard in GUARDS.values():
        assert (guard(a, b) is None) == (guard(b, a) is None)


@pytest.mark.parametrize(("a", "b"), [
    ("Who would win, the Poles or the Russians?", "Who would win, the Russians or the Poles?"),
    ("How many hours is the flight from Delhi to Toronto?", "How many hours is the flight from Toronto to Delhi?"),
    ("Should the host or the guest pay for the wedding dinner?",
     "Should the guest or the host pay for the wedding dinner?"),
    ("Did Germany beat Brazil in the 2014 World Cup?", "Did Brazil beat Germany in the 2014 World Cup?"),
    ("How do I transfer money from PayPal to my bank account?",
     "How do I transfer money from my bank account to PayPal?"),
    ("Is an iPhone better than a Samsung Galaxy for photos?", "Is a Samsung Galaxy better than an iPhone for photos?"),
    ("Why do cats hate dogs?", "Why do dogs hate cats?"),
    ("What is the exchange rate from euros to dollars?", "What is the exchange rate from dollars to euros?"),
])
def test_order_vetoes_a_reversed_role_or_direction(a: str, b: str) -> None:
    assert veto(a, b, ["order"]) is not None
    assert veto(b, a, ["order"]) is not None


@pytest.mark.parametrize(("a", "b"), [
    ("What is the difference between a virus and a bacterium?",
     "What is the difference between a bacterium and a virus?"),
    ("What are the pros and cons of nuclear energy?", "What are the cons and pros of nuclear energy?"),
    ("How can I learn Python quickly?", "What is the quickest way to learn Python?"),
    ("Is Java or Python better for beginners?", "For beginners, is Java or Python better?"),
    ("Which books are best for a beginner in Python?", "Which beginner books are best for Python?"),
    ("How do I get from the airport to the city centre?", "How can I get to the city centre from the airport?"),
])
def test_order_lets_reworded_questions_pass(a: str, b: str) -> None:
    assert veto(a, b, ["order"]) is None
