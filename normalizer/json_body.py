"""Request bodies read strictly, and written again: what goes upstream is what the proxy read.

A body is read by one strict parser (orjson): valid UTF-8, no lone surrogates, no ``NaN`` or ``Infinity``, no
number that overflows a double, nesting the encoder can write back (255 levels), and no duplicate keys — a body
with two ``"previous_response_id"`` keys is refused, not read as its last one while a server that keeps the first
reads the other. The value read is then serialised again (:func:`read_body`): that is the body forwarded, so an
upstream reading it leniently or strictly reads the one value the proxy checked. An integer beyond 64 bits is
read (and forwarded) as the nearest double, as the proxy itself reads it.

Duplicate keys are found without a second parse in the usual case: every key of a JSON text is followed by one
colon outside strings, so a body that lost a key to a duplicate holds more colons than its re-serialisation. The
colons inside strings are the same in both as long as the body writes no ``\\u`` escape (one could spell a colon);
a body that does is parsed once more, keeping every pair (:func:`_has_duplicate_key`). A body sent exactly as it is
written again (compact, as orjson writes it) lost nothing.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


class BodyProblem(ValueError):
    """A body that is not one strictly valid JSON object; ``code``: the error code that says why."""

    def __init__(self, message: str, code: str = "invalid_json") -> None:
        super().__init__(message)
        self.code = code


def read_body(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON object ``raw`` holds, and its re-serialisation (the bytes forwarded); :class:`BodyProblem` says why
    it is not one (see the module docstring)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):  # orjson reads 1,024 levels
            raise BodyProblem("the request body nests too deeply: more than 1024 levels", "nesting_too_deep") from None
        raise BodyProblem(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BodyProblem("the request body must be a JSON object")
    try:
        written = orjson.dumps(value)
    except orjson.JSONEncodeError:  # orjson writes 255 levels of nesting, reads 1024
        raise BodyProblem("the request body nests deeper than 255 levels (the most it is written again in)",
                          "nesting_too_deep") from None
    if _lost_a_key(raw, written):
        raise BodyProblem("the request body repeats a key in one object")
    return value, written


def _lost_a_key(raw: bytes, written: bytes) -> bool:
    """Whether reading ``raw`` dropped a duplicate key (``written``: what was read, serialised again)."""
    if raw == written:  # written exactly as it was sent: nothing was dropped
        return False
    sent, kept = raw.count(b":"), written.count(b":")
    if sent > kept:  # raw spells no more colons in its strings than written does: a key was lost
        return True
    if sent == kept and (b"\\" not in raw or b"\\u" not in raw):
        return False
    return _has_duplicate_key(raw)


def _has_duplicate_key(raw: bytes) -> bool:
    """Whether any object of ``raw`` (valid JSON) names one key twice: a second parse that keeps every pair."""
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        kept = dict(items)
        found = found or len(kept) != len(items)
        return kept

    json.loads(raw, object_pairs_hook=pairs)
    return found
