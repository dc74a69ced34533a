"""Guards that veto a semantic match between two questions that embed close but ask different things.

Embeddings put "how tall is the Eiffel tower in feet" and "... in meters", or "who won in 1998" and "... in
2002", next to each other. Each guard below extracts one kind of detail from both raw question texts (before
any text normalization: case matters for entities) and returns a reason when they differ, ``None`` otherwise.
Guards only ever veto: a vetoed pair costs a miss, never a wrong answer.

=============  ==========================================================================================
guard          vetoes when the two questions differ in
=============  ==========================================================================================
``numbers``    the multiset of numbers: digits ("1,000" = "1000", "3.50" = "3.5") and number words
               ("two" = "2", ordinals "second" = "2")
``quantities`` the unit attached to a number: "5 km" vs "5 miles", "$20" vs "20 euros", "10%" vs "10"
``units``      the unit words mentioned at all, with or without a number: "in feet" vs "in meters"
``dates``      years, month and weekday names, ISO/slashed dates, decades ("1990s"), "today"/"yesterday"/
               "next year"-style relative dates; "may"/"march" count as months only next to a number
``negations``  the number of negation markers: not, no, never, none, nobody, nothing, nowhere, neither,
               nor, without, cannot, and the "n't" suffix
``quoted``     a quoted string of one question ("...", '...', curly quotes, backticks, guillemets) that does
               not appear, case-insensitively, anywhere in the other
``entities``   a named-entity-like token of one question (a capitalized word that does not start a
               sentence, an acronym, a mixed-case word like "iPhone") missing, case-insensitively, from the
               other's words
``order``      the order of two words they share around a relation word (or, vs, to, from, than, over,
               against, beat...), all else alike: "Poles or Russians" vs "Russians or Poles", "from Delhi
               to Toronto" vs "from Toronto to Delhi", "host or guest" vs "guest or host", "Germany beat
               Brazil" vs "Brazil beat Germany"; not when only "and" stands between them ("a virus and a
               bacterium"), and not a subject and object swapped around any other verb
=============  ==========================================================================================

Every guard is individually switchable through ``veto(a, b, enabled_guards)``; which guards earn their
place is measured on the paraphrase workload (``python -m loadtest.bench semantic``). The extractors are
small regular expressions written here on purpose: a named-entity model would cost milliseconds per question
on the hot path and still miss the cases that matter (numbers, negations) which these rules catch exactly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from functools import lru_cache

Guard = Callable[[str, str], "str | None"]

_WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")
_NUMERAL = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|(?<![\w.,])\d+(?:\.\d+)?")
_NUMBER_WORD_VALUES: Mapping[str, int | str] = {
    **{word: value for value, word in enumerate((
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
    ))},
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
    "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12, "dozen": 12,
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "twelfth": 12, "twentieth": 20, "hundredth": 100,
    "half": "0.5", "quarter": "0.25",
}  # fmt: skip
_NUMBER_WORDS: Mapping[str, str] = {word: str(value) for word, value in _NUMBER_WORD_VALUES.items()}


_CACHE_SIZE = 4096  # extractions are cached per text: one query is compared against several candidates


def _cached_multiset(extract: Callable[[str], Counter[str]]) -> Callable[[str], tuple[str, ...]]:
    """``extract`` memoized, its multiset returned as a sorted tuple (hashable, immutable, comparable)."""

    @lru_cache(maxsize=_CACHE_SIZE)
    def cached(text: str) -> tuple[str, ...]:
        return tuple(sorted(extract(text).elements()))

    return cached


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


@lru_cache(maxsize=_CACHE_SIZE)
def _folded_words(text: str) -> frozenset[str]:
    return frozenset(word.casefold() for word in _WORD.findall(text))


def _numeral_value(text: str) -> str:
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex only matches decimal numerals
        return text
    normalized = value.normalize()
    return format(normalized, "f")


def _numbers(text: str) -> Counter[str]:
    found = Counter(_numeral_value(match) for match in _NUMERAL.findall(text))
    for word in _words(text):
        value = _NUMBER_WORDS.get(word.lower())
        if value is not None:
            found[value] += 1
    return found


_numbers_of = _cached_multiset(_numbers)


def _describe(values: Iterable[str]) -> str:
    return "{" + ", ".join(sorted(values)) + "}"


def numbers(a: str, b: str) -> str | None:
    """Veto when the questions mention different numbers (digits or number words)."""
    left, right = _numbers_of(a), _numbers_of(b)
    return None if left == right else f"numbers differ: {_describe(left)} vs {_describe(right)}"


_UNITS: Mapping[str, str] = {
    "%": "%", "percent": "%", "pct": "%", "$": "usd", "usd": "usd", "dollar": "usd", "€": "eur", "eur": "eur",
    "euro": "eur", "£": "gbp", "gbp": "gbp", "pound": "lb", "¥": "jpy", "yen": "jpy", "km": "km",
    "kilometer": "km", "kilometre": "km", "m": "m", "meter": "m", "metre": "m", "cm": "cm", "mm": "mm",
    "mile": "mi", "mi": "mi", "ft": "ft", "foot": "ft", "feet": "ft", "inch": "in", "inches": "in",
    "yard": "yd", "kg": "kg", "kilogram": "kg", "g": "g", "gram": "g", "lb": "lb", "lbs": "lb", "oz": "oz",
    "ounce": "oz", "ton": "t", "tonne": "t", "l": "l", "liter": "l", "litre": "l", "ml": "ml",
    "gallon": "gal", "gb": "gb", "mb": "mb", "tb": "tb", "kb": "kb", "byte": "byte", "bit": "bit",
    "second": "s", "sec": "s", "s": "s", "minute": "min", "min": "min", "hour": "h", "hr": "h", "h": "h",
    "day": "day", "week": "week", "month": "month", "year": "year", "decade": "decade",
    "century": "century", "c": "degc", "°c": "degc", "f": "degf", "°f": "degf", "celsius": "degc",
    "fahrenheit": "degf", "kelvin": "k", "mph": "mph", "kmh": "kmh", "hz": "hz", "ghz": "ghz", "mhz": "mhz",
    "w": "w", "kw": "kw", "watt": "w", "volt": "v", "v": "v", "calorie": "kcal", "kcal": "kcal",
}  # fmt: skip
_QUANTITY = re.compile(r"(?P<prefix>[$€£¥])?\s?(?P<number>\d[\d,]*(?:\.\d+)?)\s?(?P<unit>%|°\s?[cfCF]\b|[A-Za-z]+)?")


def _unit(token: str) -> str | None:
    word = token.lower().replace(" ", "")
    if word in _UNITS:
        return _UNITS[word]
    if len(word) > 3 and word.endswith("s") and word[:-1] in _UNITS:
        return _UNITS[word[:-1]]
    return None


def _quantities(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for match in _QUANTITY.finditer(text):
        tokens = (match["prefix"], match["unit"])
        units = [unit for unit in (_unit(token) for token in tokens if token) if unit]
        if units:
            found[f"{_numeral_value(match['number'].rstrip(','))} {'+'.join(units)}"] += 1
    return found


_quantities_of = _cached_multiset(_quantities)


def quantities(a: str, b: str) -> str | None:
    """Veto when the numbers carry different units or currencies."""
    left, right = _quantities_of(a), _quantities_of(b)
    return None if left == right else f"quantities differ: {_describe(left)} vs {_describe(right)}"


# Whole words that name a unit and hardly mean anything else ("second", "pound", "day" are left out).
_UNIT_WORDS: Mapping[str, str] = {
    word: unit
    for unit, words in {
        "%": ("percent", "percentage"), "usd": ("dollar", "dollars", "usd"), "eur": ("euro", "euros", "eur"),
        "jpy": ("yen",), "km": ("km", "kilometer", "kilometers", "kilometre", "kilometres"),
        "m": ("meter", "meters", "metre", "metres"), "cm": ("cm", "centimeter", "centimeters"),
        "mm": ("mm", "millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("ft", "feet", "foot"),
        "in": ("inches",), "yd": ("yard", "yards"), "kg": ("kg", "kilogram", "kilograms", "kilo", "kilos"),
        "g": ("gram", "grams"), "lb": ("lb", "lbs"), "oz": ("ounce", "ounces", "oz"),
        "t": ("tonne", "tonnes"), "l": ("liter", "liters", "litre", "litres"), "ml": ("ml", "milliliters"),
        "gal": ("gallon", "gallons"), "degc": ("celsius", "centigrade"), "degf": ("fahrenheit",),
        "k": ("kelvin",), "mph": ("mph",), "kmh": ("kmh", "kph"), "gb": ("gb", "gigabyte", "gigabytes"),
        "mb": ("mb", "megabyte", "megabytes"), "tb": ("tb", "terabyte", "terabytes"),
        "w": ("watt", "watts"), "kw": ("kw", "kilowatt", "kilowatts"), "kwh": ("kwh",),
        "kcal": ("calorie", "calories", "kcal"), "acre": ("acre", "acres"), "ha": ("hectare", "hectares"),
    }.items()
    for word in words
}  # fmt: skip


@lru_cache(maxsize=_CACHE_SIZE)
def _unit_words(text: str) -> frozenset[str]:
    found = {_UNIT_WORDS[word] for word in _folded_words(text) if word in _UNIT_WORDS}
    found.update(_UNITS[symbol] for symbol in "$€£¥%" if symbol in text)
    return frozenset(found)


def units(a: str, b: str) -> str | None:
    """Veto when the questions name different units or currencies, with or without numbers."""
    left, right = _unit_words(a), _unit_words(b)
    if left == right:
        return None
    return f"units differ: {{{', '.join(sorted(left))}}} vs {{{', '.join(sorted(right))}}}"


_MONTHS: Mapping[str, str] = {
    **{name: name for name in (
        "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
        "november", "december",
    )},
    "jan": "january", "feb": "february", "mar": "march", "apr": "april", "jun": "june", "jul": "july",
    "aug": "august", "sep": "september", "sept": "september", "oct": "october", "nov": "november",
    "dec": "december",
}  # fmt: skip
_AMBIGUOUS_MONTHS = frozenset({"may", "march", "mar", "jan", "dec", "oct", "sep", "aug", "jun", "jul"})
_WEEKDAYS = frozenset({"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"})
_RELATIVE_DAYS = frozenset({"today", "tomorrow", "yesterday", "tonight", "now", "currently", "recently"})
_RELATIVE_SPANS = re.compile(r"\b(last|next|this|previous|coming)\s+(week|month|year|decade|century)\b", re.I)
_YEAR = re.compile(r"(?<![\w.,])(1[5-9][0-9]{2}|20[0-9]{2}|21[0-9]{2})(s)?(?![\w.,]\d)")
_FULL_DATE = re.compile(r"\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b")
_ERA = re.compile(r"\b(\d+)\s*(bc|bce|ad|ce)\b", re.I)


def _dates(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    found.update(f"date:{m}" for m in _FULL_DATE.findall(text))
    found.update(f"year:{year}{decade}" for year, decade in _YEAR.findall(text))
    found.update(f"era:{num}{era.lower()}" for num, era in _ERA.findall(text))
    found.update(f"rel:{a.lower()} {b.lower()}" for a, b in _RELATIVE_SPANS.findall(text))
    words = _words(text)
    for index, word in enumerate(words):
        lower = word.lower()
        if lower in _WEEKDAYS or lower in _RELATIVE_DAYS:
            found[f"day:{lower}"] += 1
        elif lower in _MONTHS:
            neighbours = words[max(index - 1, 0) : index] + words[index + 1 : index + 2]
            if lower not in _AMBIGUOUS_MONTHS or any(n[:1].isdigit() for n in neighbours):
                found[f"month:{_MONTHS[lower]}"] += 1
    return found


_dates_of = _cached_multiset(_dates)


def dates(a: str, b: str) -> str | None:
    """Veto when the questions refer to different dates, years, months, weekdays or relative periods."""
    left, right = _dates_of(a), _dates_of(b)
    return None if left == right else f"dates differ: {_describe(left)} vs {_describe(right)}"


_NEGATION_WORDS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor", "without", "cannot"}
)


@lru_cache(maxsize=_CACHE_SIZE)
def _negation_count(text: str) -> int:
    count = 0
    for word in _words(text):
        lower = word.lower().replace("\u2019", "'")
        if lower in _NEGATION_WORDS or lower.endswith("n't"):
            count += 1
    return count


def negations(a: str, b: str) -> str | None:
    """Veto when one question is negated differently from the other ("is X" vs "is X not")."""
    left, right = _negation_count(a), _negation_count(b)
    return None if left == right else f"negations differ: {left} vs {right}"


_QUOTED = re.compile(
    r'"([^"]+)"|\u201c([^\u201d]+)\u201d|\u00ab([^\u00bb]+)\u00bb|`([^`]+)`|\u2018([^\u2019]+)\u2019'
    r"|(?<!\w)'([^']+)'(?!\w)"
)


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


@lru_cache(maxsize=_CACHE_SIZE)
def _quoted(text: str) -> tuple[str, ...]:
    return tuple(_fold(next(group for group in match if group)) for match in _QUOTED.findall(text))


def quoted(a: str, b: str) -> str | None:
    """Veto when a quoted string of either question is absent from the other (quoted or not)."""
    for this, other in ((a, b), (b, a)):
        folded = _fold(other)
        for span in _quoted(this):
            if span not in folded:
                return f"quoted string {span!r} not in the other question"
    return None


_SENTENCE_ENDS = frozenset(".!?:;")
_NOT_ENTITIES = frozenset({"I", "I'm", "I've", "I'd", "I'll", "OK"})


@lru_cache(maxsize=_CACHE_SIZE)
def _entities(text: str) -> frozenset[str]:
    found: set[str] = set()
    previous_end = 0
    for index, match in enumerate(_WORD.finditer(text)):
        word = match.group(0)
        starts_sentence = index == 0 or any(c in _SENTENCE_ENDS for c in text[previous_end : match.start()])
        previous_end = match.end()
        if word in _NOT_ENTITIES or word[:1].isdigit():
            continue
        letters = [c for c in word if c.isalpha()]
        acronym = len(letters) >= 2 and all(c.isupper() for c in letters)
        mixed = any(c.isupper() for c in word[1:]) and any(c.islower() for c in word)
        capitalized = word[:1].isupper() and not starts_sentence
        if acronym or mixed or capitalized:
            found.add(word.casefold())
    return frozenset(found)


def entities(a: str, b: str) -> str | None:
    """Veto when a named-entity-like token of either question is missing from the other's words."""
    for this, other in ((a, b), (b, a)):
        missing = sorted(_entities(this) - _folded_words(other))
        if missing:
            return f"entities differ: {', '.join(missing)} missing from the other question"
    return None


_ORDER_FILLER = frozenset({
    "a", "an", "the", "of", "in", "on", "at", "for", "by", "with", "from", "to", "into", "or", "vs", "versus",
    "than", "over", "against", "is", "are", "was", "were", "be", "do", "does", "did", "will", "would", "should",
    "can", "could", "who", "what", "which", "how", "when", "where", "why", "i", "you", "it", "my", "your", "me",
    "and", "better", "more", "less",
})  # fmt: skip
"""Words whose place says nothing by itself: the relation words (``or``, ``to``, ``than``...) and articles; the
swapped words are the others."""
_SYMMETRIC_JOIN = frozenset({"and", "&", "the", "a", "an"})
_RELATIONS = frozenset({"or", "vs", "versus", "v", "to", "into", "than", "over", "against", "beat", "beats", "defeat",
                        "defeats", "defeated", "from", "for", "like", "hate", "hates", "love", "loves"})
"""Words that give the words on either side roles: a choice, a direction, a comparison, a contest, a feeling."""


@lru_cache(maxsize=_CACHE_SIZE)
def _order_tokens(text: str) -> tuple[str, ...]:
    return tuple(word.casefold() for word in _WORD.findall(text))


def _shared_in_order(words: tuple[str, ...], shared: Counter[str]) -> list[str]:
    left = Counter(shared)
    kept = []
    for word in words:
        if word not in _ORDER_FILLER and left[word] > 0:
            left[word] -= 1
            kept.append(word)
    return kept


def _between(words: tuple[str, ...], first: str, second: str) -> tuple[str, ...]:
    """The words between the first ``first`` and the next ``second`` after it."""
    start = words.index(first)
    end = words.index(second, start + 1) if second in words[start + 1:] else start + 1
    return words[start + 1:end]


def _related(words: tuple[str, ...], first: str, second: str) -> bool:
    """Whether a relation word, and not only "and", stands between ``first`` and ``second``."""
    between = _between(words, first, second)
    if between and set(between) <= _SYMMETRIC_JOIN:
        return False
    return not _RELATIONS.isdisjoint(between)


def _role(words: tuple[str, ...], word: str) -> str | None:
    """The relation word just before ``word`` (only articles and the like between them), if any."""
    for before in reversed(words[:words.index(word)]):
        if before in _RELATIONS:
            return before
        if before not in _ORDER_FILLER:
            return None
    return None


def _exchanged(first: list[str], second: list[str]) -> tuple[list[str], list[str]] | None:
    """(X, Y) when ``second`` is ``first`` with two runs of words X and Y exchanged (X ... Y ... becomes Y ... X)."""
    if len(first) != len(second) or first == second:
        return None
    start = next(i for i, (x, y) in enumerate(zip(first, second, strict=True)) if x != y)
    end = len(first) - next(i for i, (x, y) in enumerate(zip(reversed(first), reversed(second), strict=True))
                            if x != y)
    left, right = first[start:end], second[start:end]
    for x_len in range(1, len(left)):
        for y_len in range(1, len(left) - x_len + 1):
            x, middle, y = left[:x_len], left[x_len:len(left) - y_len], left[len(left) - y_len:]
            if right == y + middle + x:
                return x, y
    return None


def order(a: str, b: str) -> str | None:
    """Veto when exchanging two runs of shared words of one question gives the other's order of shared words, in
    both a relation word stands between them (a choice, a direction, a comparison or a contest reversed), and the
    runs did not take their relation words along ("from the airport to the city" is "to the city from the
    airport"); "and" alone between them is no relation ("a virus and a bacterium")."""
    left, right = _order_tokens(a), _order_tokens(b)
    shared = Counter(w for w in left if w not in _ORDER_FILLER) & Counter(w for w in right if w not in _ORDER_FILLER)
    exchanged = _exchanged(_shared_in_order(left, shared), _shared_in_order(right, shared))
    if exchanged is None:
        return None
    x, y = exchanged
    if not (_related(left, x[-1], y[0]) and _related(right, y[-1], x[0])):
        return None
    if _role(left, x[0]) == _role(right, x[0]) and _role(left, y[0]) == _role(right, y[0]):
        return None  # each kept its own relation word: "to the city from the airport"
    return f"order differs: {' '.join(x)} ... {' '.join(y)} vs {' '.join(y)} ... {' '.join(x)}"


# Words that frame a question without changing what it asks: articles, auxiliaries, pronouns, question words and
# request wrappers ("tell me", "I want to know", "can you find out"). Nouns are never in this list: "who is the
# author of X" and "who is the publisher of X" must stay different questions.
_FRAMING_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "but",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "who",
        "whom",
        "whose",
        "what",
        "which",
        "when",
        "where",
        "why",
        "how",
        "that",
        "this",
        "these",
        "those",
        "it",
        "its",
        "there",
        "their",
        "they",
        "them",
        "he",
        "she",
        "his",
        "her",
        "him",
        "we",
        "you",
        "your",
        "i",
        "me",
        "my",
        "our",
        "us",
        "as",
        "into",
        "about",
        "so",
        "than",
        "then",
        "what's",
        "who's",
        "where's",
        "when's",
        "i'd",
        "i'm",
        "tell",
        "know",
        "want",
        "like",
        "please",
        "would",
        "could",
        "can",
        "find",
        "out",
        "question",
        "quick",
        "exactly",
    ]
)


@lru_cache(maxsize=_CACHE_SIZE)
def _content_words(text: str) -> frozenset[str]:
    found = set()
    for word in re.findall(r"[\w']+", text.lower()):
        if word in _FRAMING_WORDS or len(word) < 3:
            continue
        found.add(word[:-1] if word.endswith("s") and len(word) > 3 else word)
    return frozenset(found)


def content_words(a: str, b: str) -> str | None:
    """Veto when a content word of one question is missing from the other.

    Lower-cased, a plural ``s`` dropped, framing words ignored (articles, auxiliaries, pronouns, question words and
    request wrappers — never nouns). It catches the false friend no embedding threshold separates: one content word
    swapped ("... call the midwife" vs "... call the quiet"). Cost: a paraphrase that swaps a synonym is vetoed — a
    miss, never a wrong answer; measured in BENCHMARKS.md (semantic tier).
    """
    left, right = _content_words(a), _content_words(b)
    differ = sorted(left ^ right)
    return f"content words differ: {', '.join(differ[:3])}" if differ else None


GUARDS: Mapping[str, Guard] = {
    "numbers": numbers,
    "quantities": quantities,
    "units": units,
    "dates": dates,
    "negations": negations,
    "quoted": quoted,
    "entities": entities,
    "order": order,
    "content_words": content_words,
}
"""Every guard by name, in the order :func:`veto` runs them."""

DEFAULT_GUARDS: tuple[str, ...] = tuple(GUARDS)


def veto(a: str, b: str, enabled_guards: Iterable[str] | None = None) -> str | None:
    """The first enabled guard's veto (``"<guard>: <detail>"``), or ``None`` when all let the match pass.

    ``enabled_guards`` defaults to :data:`DEFAULT_GUARDS`; unknown names raise :class:`ValueError`.
    """
    names = DEFAULT_GUARDS if enabled_guards is None else tuple(enabled_guards)
    unknown = [name for name in names if name not in GUARDS]
    if unknown:
        raise ValueError(f"unknown guard(s) {unknown}; known: {list(GUARDS)}")
    for name in names:
        reason = GUARDS[name](a, b)
        if reason is not None:
            return f"{name}: {reason}"
    return None
