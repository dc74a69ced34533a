"""Bodies read strictly and written again (normalizer/json_body.py): what the strict parser refuses, and the
duplicate-key check without a second parse agreeing with one that keeps every pair, on any JSON text."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from normalizer.json_body import BodyProblem, _has_duplicate_key, read_body


@pytest.mark.parametrize(("raw", "words"), [
    (b'{"a": NaN}', "not valid JSON"), (b'{"a": Infinity}', "not valid JSON"), (b'{"a": "\\ud800"}', "not valid"),
    (b'{"a": "\xff"}', "not valid"), (b'{"a": 1e400}', "not valid"), (b"[1, 2]", "a JSON object"),
    (b'{"a": 1, "a": 2}', "repeats a key"), (b'{"a": 1, "b": {"c": 1, "c": 1}}', "repeats a key"),
    (b'{"a" : 1 ,\n "a"\t: 2}', "repeats a key"), (b'{"\\u0061": 1, "a": 2}', "repeats a key"),
    (b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}", "nests deeper"),
])
def test_what_is_refused(raw: bytes, words: str) -> None:
    with pytest.raises(BodyProblem, match=words):
        read_body(raw)


def test_what_is_read_is_what_is_written() -> None:
    value, written = read_body(b'{ "model" : "m",\n "input": "he said \\": no\\" \\u00e9" }')
    assert value == {"model": "m", "input": 'he said ": no" é'}
    assert written == orjson.dumps(value)


_keys = st.sampled_from(["a", "b", 'q":', ' :x', "é", "\\", '"'])
_leaf = st.one_of(st.integers(-5, 5), st.text(alphabet='ab ":\\é', max_size=6), st.booleans(), st.none())
_pairs = st.recursive(
    st.lists(st.tuples(_keys, _leaf), max_size=4),
    lambda inner: st.lists(st.tuples(_keys, st.one_of(_leaf, inner, st.lists(inner, max_size=2))), max_size=4),
    max_leaves=12)


def _text(pairs: Any, spaced: bool, escaped: bool) -> str:
    """A JSON text of an object written as ``pairs`` (keys may repeat): spaced out, and with \\u escapes."""
    def value(item: Any) -> str:
        if isinstance(item, list) and all(isinstance(p, tuple) for p in item):
            return _text(item, spaced, escaped)
        if isinstance(item, list):
            return "[" + ", ".join(value(element) for element in item) + "]"
        return json.dumps(item, ensure_ascii=escaped)

    colon = " : " if spaced else ":"
    return "{" + ", ".join(json.dumps(key, ensure_ascii=escaped) + colon + value(item) for key, item in pairs) + "}"


@given(_pairs, st.booleans(), st.booleans())
def test_duplicate_keys_are_found_exactly(pairs: Any, spaced: bool, escaped: bool) -> None:
    raw = _text(pairs, spaced, escaped).encode()
    try:
        read_body(raw)
    except BodyProblem as problem:
        assert "repeats a key" in str(problem) and _has_duplicate_key(raw)
    else:
        assert not _has_duplicate_key(raw)
