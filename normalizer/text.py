"""Query-text normalization: named, documented steps, each stating what it may merge.

Tiers that compare question texts (the semantic tier's embedding cache, a text-keyed lookup) normalize them
first, so that trivially different spellings of one question meet. Every step can merge two texts; the
docstring of each step says which. A step that can merge questions with *different* answers is off by default:

================  =======  =============================================================================
step              default  may merge
================  =======  =============================================================================
``nfkc``          on       compatibility forms: full-width letters/digits with ASCII ones, the "fi"
                           ligature with "fi", superscript two with "2"
``lowercase``     on       case: "Apple"/"apple" (the company and the fruit), "US"/"us" (casefold)
``contractions``  on       "don't"/"do not", "it's"/"it is", "I'd"/"I would" (also the rarer "I had")
``punctuation``   on       "what?"/"what", "e-mail"/"e mail", "U.S."/"U S" (kept: punctuation between
                           digits, so "3.5" and "3,500" survive, and ``% # & @``, so "10%" and "C#" do)
``whitespace``    on       runs of spaces, tabs and newlines; leading/trailing space
``stopwords``     off      "the capital of France"/"capital France": drops words like "of"/"to" that can
                           carry meaning ("not" and the other negations are never dropped)
``sort_words``    off      word order: "dog bites man"/"man bites dog"
================  =======  =============================================================================

Steps always run in the order of the table, whatever order the configuration lists them in: contractions
must be expanded before apostrophes are stripped, and words can only be sorted once they are clean. The
contraction and stop-word tables are written out here because they are short, English-only and must be
reviewable line by line; no library offers exactly these conservative lists.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable, Iterable, Mapping

TextStep = Callable[[str], str]


def nfkc(text: str) -> str:
    """Unicode NFKC: compatibility characters become plain forms (full-width, ligatures, superscripts)."""
    return unicodedata.normalize("NFKC", text)


def lowercase(text: str) -> str:
    """Unicode case folding (``str.casefold``): merges case variants, including German "ß"/"ss"."""
    return text.casefold()


_APOSTROPHES = re.compile(r"[\u2019\u2018\u02bc\u0060\u00b4]")
_IRREGULAR = {
    "won't": "will not",
    "can't": "can not",
    "cannot": "can not",
    "shan't": "shall not",
    "ain't": "is not",
    "let's": "let us",
}
_PRONOUN_IS = (
    "it", "that", "what", "who", "where", "when", "why", "how", "there", "here", "he", "she", "this",
)  # fmt: skip
_SUFFIXES = (
    ("n't", " not"), ("'re", " are"), ("'ve", " have"), ("'ll", " will"), ("'m", " am"), ("'d", " would"),
)  # fmt: skip
_WORD_WITH_APOSTROPHE = re.compile(r"\b[\w]+'[\w]+\b")


def _expand(match: re.Match[str]) -> str:
    word = match.group(0)
    lower = word.lower()
    if lower in _IRREGULAR:
        return _IRREGULAR[lower]
    for suffix, replacement in _SUFFIXES:
        if lower.endswith(suffix) and len(lower) > len(suffix):
            return word[: -len(suffix)] + replacement
    if lower.endswith("'s") and lower[:-2] in _PRONOUN_IS:
        return word[:-2] + " is"
    return word  # possessive "John's" and unknown forms stay as written


def contractions(text: str) -> str:
    """Expand common English contractions; "'s" only after pronouns/question words (else it is a possessive).

    May merge "I'd" meaning "I had" with "I would", and "he's" meaning "he has" with "he is".
    """
    text = _APOSTROPHES.sub("'", text)
    text = re.sub(r"\bcannot\b", "can not", text, flags=re.IGNORECASE)
    return _WORD_WITH_APOSTROPHE.sub(_expand, text)


def _is_punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


_DIGIT_JOINERS = frozenset(".,:/")
_MEANINGFUL = frozenset("%#&@")


def punctuation(text: str) -> str:
    """Replace Unicode punctuation (categories P*) with spaces, except ``. , : /`` between two digits.

    ``% # & @`` are kept (they carry meaning: "10%", "C#", "AT&T"), as are symbols (``$ + = <``). May merge
    "e-mail" with "e mail", "U.S." with "U S", "what?" with "what".
    """
    out: list[str] = []
    last = len(text) - 1
    for index, char in enumerate(text):
        if (
            char in _MEANINGFUL
            or not _is_punctuation(char)
            or (
                char in _DIGIT_JOINERS
                and 0 < index < last
                and text[index - 1].isdigit()
                and text[index + 1].isdigit()
            )
        ):
            out.append(char)
        else:
            out.append(" ")
    return "".join(out)


def whitespace(text: str) -> str:
    """Collapse every run of whitespace into one space and strip both ends."""
    return " ".join(text.split())


STOPWORDS = frozenset(
    {
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "by", "with", "from", "and", "or", "is", "are",
        "was", "were", "be", "been", "do", "does", "did", "please", "me", "tell", "i", "you", "it", "that",
        "this", "these", "those", "can", "could", "would", "should", "will", "about", "as", "so", "just",
    }
)  # fmt: skip
"""Words dropped by ``stopwords``; negations ("not", "no", "never", "without") are deliberately absent."""


def stopwords(text: str) -> str:
    """Drop :data:`STOPWORDS` (compared case-insensitively). Off by default: it merges different questions."""
    return " ".join(word for word in text.split() if word.casefold() not in STOPWORDS)


def sort_words(text: str) -> str:
    """Sort the words. Off by default: "dog bites man" and "man bites dog" become one question."""
    return " ".join(sorted(text.split()))


STEPS: Mapping[str, TextStep] = {
    "nfkc": nfkc,
    "lowercase": lowercase,
    "contractions": contractions,
    "punctuation": punctuation,
    "whitespace": whitespace,
    "stopwords": stopwords,
    "sort_words": sort_words,
}
"""Every step by name, in the order they run."""

DEFAULT_STEPS: tuple[str, ...] = ("nfkc", "lowercase", "contractions", "punctuation", "whitespace")


class TextNormalizer:
    """Applies a chosen set of :data:`STEPS` (in their fixed order) to query texts."""

    def __init__(self, steps: Iterable[str] = DEFAULT_STEPS) -> None:
        chosen = set(steps)
        unknown = chosen - STEPS.keys()
        if unknown:
            raise ValueError(f"unknown text normalization step(s) {sorted(unknown)}; known: {list(STEPS)}")
        self.steps: tuple[str, ...] = tuple(name for name in STEPS if name in chosen)
        self._functions = tuple(STEPS[name] for name in self.steps)

    def __call__(self, text: str) -> str:
        for step in self._functions:
            text = step(text)
        return text


# -- the question as the exact key holds it -------------------------------------------------------------------------

_PLAIN = (string.ascii_letters + string.digits + " \t,.?!:()-/+%&@#$*").encode()
"""ASCII characters that never need care: a question made of these only takes the short path."""
_CODE = frozenset("{};=<>\\\n\r")
"""A question with any of these (or a code fence) is code or a multi-line prompt (documents, a pasted file):
whitespace can matter there, so it only loses its outer whitespace."""
_QUOTES = frozenset("\"'`\u201c\u00ab\u2018")
_QUOTED = re.compile(
    r'"[^"]*"|\u201c[^\u201d]*\u201d|\u00ab[^\u00bb]*\u00bb|`[^`]*`|\u2018[^\u2019]*\u2019|(?<!\w)\'[^\']*\'(?!\w)'
)
"""Spans kept as written: anything quoted or in backticks."""
_SPACES = re.compile(r"\s+")
_TECHNICAL = re.compile(r"[/\\|$*%#@&+^~_\[\]]|(?<!\S)--?\w")


def technical(text: str) -> bool:
    """Whether ``text`` reads as technical (a path, an operator, a shell flag, a placeholder): its inner whitespace
    is then kept as written by :func:`fold_question`."""
    return _TECHNICAL.search(text) is not None


def _fold_prose(text: str) -> str:
    """Runs of whitespace as one space, typographic apostrophes as apostrophes."""
    return _SPACES.sub(" ", text).replace("\u2019", "'")


def _fold_technical(text: str) -> str:
    """Each non-breaking space as a space (runs kept as long as they are), typographic apostrophes as apostrophes."""
    return text.replace("\u00a0", " ").replace("\u2019", "'")


def _without_end_mark(text: str) -> str:
    """``text`` without its final question mark when it is a single one right after a word ("What is RAG?"); a run
    of them, or one after a space, stays ("the C# operator ??", "operator ?")."""
    return text[:-1] if len(text) >= 2 and text[-1] == "?" and text[-2].isalnum() else text


def fold_question(text: str) -> str:
    """The final question as the exact key holds it: spellings that cannot change the answer folded into one.

    Folded: canonically equivalent Unicode (NFC: a precomposed ``\u00e9`` and ``e`` + combining accent), leading and
    trailing whitespace, runs of whitespace between words outside quoted and backticked spans, typographic
    apostrophes there, and a single final question mark right after a word. Kept as written: letter case (``CO``
    carbon monoxide, ``Co`` cobalt; ``tar -C`` and ``tar -c``; ``MB`` and ``Mb``), every other punctuation (``5!`` is
    a factorial, ``??`` an operator), compatibility forms (NFKC would turn ``2\u00b3`` into ``23``), and everything
    inside quotes or backticks. A question that looks like code or spans lines (a code fence, any of
    ``{ } ; = < > \\``, a line break) only loses its outer whitespace; unquoted technical text (a path, an operator,
    a shell flag: :func:`technical`) keeps its runs of whitespace as written (``sed s/a  b/c/``). What the rule is
    unsure of stays apart: a miss, never a wrong answer (``tests/normalizer/test_text.py`` holds the pairs that must
    not fold). A question of plain ASCII letters, digits, spaces and common punctuation takes a short path of string
    methods (the exact key is on every request's path).
    """
    if text.isascii() and not text.encode().translate(None, _PLAIN):
        plain = text.strip()
        if ("  " in plain or "\t" in plain) and not technical(plain):
            plain = " ".join(plain.split())
        return _without_end_mark(plain)
    stripped = text.strip()
    if not stripped.isascii():
        stripped = unicodedata.normalize("NFC", stripped)
    if "```" in stripped or not _CODE.isdisjoint(stripped) or "\n" in stripped or "\r" in stripped:
        return stripped
    if _QUOTES.isdisjoint(stripped):
        return _without_end_mark(_fold_technical(stripped) if technical(stripped) else _fold_prose(stripped))
    fold = _fold_technical if technical(_QUOTED.sub(" ", stripped)) else _fold_prose
    parts: list[str] = []
    last = 0
    for match in _QUOTED.finditer(stripped):
        parts += (fold(stripped[last:match.start()]), match.group(0))
        last = match.end()
    parts.append(fold(stripped[last:]))
    return _without_end_mark("".join(parts))
