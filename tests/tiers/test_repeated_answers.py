"""Answers given word for word to several distinct questions of a namespace are told apart, within a budget."""

from __future__ import annotations

import gc
import tracemalloc

from tiers.repeated_answers import ANSWERS, REPEATED, RepeatedAnswers


def test_an_answer_given_to_three_distinct_questions_is_repeated() -> None:
    replies = RepeatedAnswers()
    replies.learn("t\x1fns", "Build done on host A. Reply with 1 to 5", "1 2 3 4 5")
    replies.learn("t\x1fns", "build done on host A.  reply with 1 to 5", "1, 2, 3, 4, 5.")
    replies.learn("t\x1fns", "Build done on host B. Reply with 1 to 5", "1 2 3 4 5")
    assert not replies.repeated("t\x1fns", "1 2 3 4 5"), "one question asked twice counts once"
    replies.learn("t\x1fns", "Build done on host C. Reply with 1 to 5", "1 2 3 4 5")
    assert replies.repeated("t\x1fns", "1 2 3 4 5") and replies.repeated("t\x1fns", "1 - 2 - 3 - 4 - 5")
    assert not replies.repeated("t\x1fother", "1 2 3 4 5"), "namespaces learn apart"
    assert REPEATED == 3


def test_the_ledger_figure_is_what_the_namespaces_hold_and_a_flooding_tenant_forgets_its_own() -> None:
    replies = RepeatedAnswers(max_bytes=10**9)
    gc.collect()
    tracemalloc.start()
    try:
        for n in range(20 * ANSWERS):
            replies.learn(f"tenant\x1fnamespace-{n // ANSWERS}", f"question {n}", f"answer number {n}")
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    [account] = replies.memory()
    assert account.entries == 20
    assert 0.8 <= account.bytes / measured <= 1.25, (account.bytes, measured)
    bounded = RepeatedAnswers(max_bytes=512 * 1024)
    bounded.learn("alice\x1fapp", "q", "a fixed reply")
    for n in range(50 * ANSWERS):
        bounded.learn(f"mallory\x1fns-{n // ANSWERS}", f"question {n}", f"answer {n}")
        assert bounded.memory()[0].bytes <= 512 * 1024
    assert "alice\x1fapp" in bounded._answers and "mallory\x1fns-0" not in bounded._answers
