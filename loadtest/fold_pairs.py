"""Variants of a question for the exact key's folding (:func:`normalizer.text.fold_question`): pairs whose answers
can differ, which must never share an exact key, and variants that keep the meaning, which must. Written by hand
from the kinds of variant that change an answer (units' and chemical symbols' letter case, command-line flags,
acronyms, ``!``, superscripts, whitespace inside quotes and code), not from the folding rule. Used by the tests
and by ``bench abuse``."""

from __future__ import annotations

MEANING_CHANGES = [
    ("Is CO dangerous?", "Is Co dangerous?"),  # carbon monoxide, cobalt
    ("How many bits in 5 MB?", "How many bits in 5 Mb?"),  # megabytes, megabits
    ("What is 9.8 G in m/s2?", "What is 9.8 g in m/s2?"),  # gravitational constant vs acceleration
    ("What does tar -C do?", "What does tar -c do?"),  # command-line flags
    ("What does ls -R show?", "What does ls -r show?"),
    ("Where is Polish spoken?", "Where is polish spoken?"),  # a language, a verb
    ("What is 2\u00b3?", "What is 23?"),  # superscripts
    ("What is 2\u00b9\u2070?", "What is 210?"),
    ("What is H\u2082O?", "What is H2O2?"),
    ("What is 5!", "What is 5?"),  # a factorial
    ("Compute 10!", "Compute 10"),
    ("What is SN?", "What is Sn?"),  # supernova, tin
    ("What is NaCl?", "What is NACL?"),
    ("Is it US policy?", "Is it us policy?"),  # an acronym, a word
    ("Define IT", "Define it"),
    ("How much is 5 mm?", "How much is 5 Mm?"),  # millimetre, megametre
    ('What does "a  b" match?', 'What does "a b" match?'),  # whitespace inside quotes
    ("What does `x  y` print?", "What does `x y` print?"),  # and inside backticks
    ('What does "Foo" return?', 'What does "foo" return?'),
    ("What is 3.5?", "What is 35?"),
    ("Who is not here?", "Who is here?"),
    ("Explain: x = Foo;", "Explain: x = foo;"),
    ("Fix this\nMyVar = 1", "Fix this\nmyvar = 1"),
    ("Is it done.", "Is it done"),
    ("Really?!", "Really"),
    ("\uff37hat is 1?", "What is 1?"),  # a full-width letter is a compatibility form
    ("Explain the C# operator ??", "Explain the C# operator ?"),  # null-coalescing, conditional
    ("Explain the C# operator ??", "Explain the C# operator"),
    ("What does the regex a?? match", "What does the regex a? match"),  # lazy, greedy
    ("What does sed s/a  b/c/ do?", "What does sed s/a b/c/ do?"),  # whitespace in unquoted technical text
    ("What does cut -d ' '  -f2 print", "What does cut -d ' ' -f2 print"),
]
"""Pairs of questions whose answers can differ: they never share an exact key."""

KEEPS_MEANING = [
    ("What is the capital of France?", "What is the capital of France"),
    ("What is the capital of France?", "  What is the capital of France?  "),
    ("What is the capital of France?", "What  is the\tcapital of France"),
    ("What is the capital of France?", "What is the capital\u00a0of France?"),
    ("Who founded the caf\u00e9 chain?", "Who founded the cafe\u0301 chain?"),
    ("What\u2019s a proxy?", "What's a proxy"),
    ('Why does "a  b" fail?', 'Why  does "a  b" fail'),
]
"""Pairs that differ only in what cannot change an answer: they share an exact key."""
