"""Canonical JSON values: one encoding for every equivalent JSON value, and the bytes a key is hashed from.

Two JSON documents that mean the same thing must produce the same bytes here:

- object key order is irrelevant: :func:`canonical_bytes` serializes with orjson's ``OPT_SORT_KEYS``;
- whitespace is irrelevant: values are re-serialized, never hashed as received;
- number formatting is irrelevant: ``1``, ``1.0`` and ``1e0`` are the same number; an integral float whose
  magnitude is below 2**53 becomes an ``int`` and every other float keeps its shortest round-trip form
  (orjson prints the shortest repr); ``-0.0`` becomes ``0``. Booleans stay booleans (``True`` is not ``1``
  here, even though Python says it is).

A float of magnitude 2**53 or more is refused (:class:`CanonicalizationError`): orjson parses an integer literal
beyond 64 bits as the nearest float, so distinct integers (``18446744073709551616`` and ``…617``) would become
one value. Such a request is not keyed at all rather than keyed wrongly. Integers within 64 bits stay ints.

Non-finite floats (NaN, Infinity) are not JSON; orjson refuses to parse them, so they never reach the proxy
from the wire. :func:`canonical_value` rejects them with :class:`CanonicalizationError` instead of guessing.

JSON Schemas are the one place where the order of an object's keys is meaning, not encoding: a model sees a
tool's ``parameters`` rendered in order, and constrained decoding (``response_format: json_schema``) emits
an object's fields in the order of the schema's ``properties``. :func:`canonical_schema` therefore keeps
``properties`` (and ``patternProperties``, ``$defs``/``definitions`` are plain maps and sorted) as an
ordered list of ``[name, schema]`` pairs, so reordering properties changes a key while reordering any other
schema keyword does not.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

JSONValue = Any
"""A JSON value as parsed by orjson: dict, list, str, int, float, bool or None."""

_MAX_EXACT_FLOAT_INT = 2**53
_ORDERED_SCHEMA_MAPS = frozenset({"properties", "patternProperties"})


class CanonicalizationError(ValueError):
    """A request body that cannot be put into canonical form (malformed for its endpoint)."""


def canonical_number(value: int | float) -> int | float:
    """The canonical form of a JSON number: integral floats as ``int``, ``-0.0`` as ``0``; a float of magnitude
    2**53 or more is refused (see the module docstring)."""
    if isinstance(value, bool):
        raise CanonicalizationError("a boolean is not a number")
    if isinstance(value, int):
        return value
    if not math.isfinite(value):
        raise CanonicalizationError(f"non-finite number {value!r} is not valid JSON")
    if abs(value) >= _MAX_EXACT_FLOAT_INT:
        raise CanonicalizationError(f"{value!r} may be an integer beyond 64 bits, rounded by the JSON parser")
    if value.is_integer():
        return int(value)
    return value


def canonical_value(value: JSONValue) -> JSONValue:
    """``value`` with every number canonical and every container copied (key order left to the encoder)."""
    kind = type(value)  # exact-type dispatch first: this runs for every node of every request on the hot path
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return {key if type(key) is str else str(key): canonical_value(item) for key, item in value.items()}
    if kind is list:
        return [canonical_value(item) for item in value]
    if kind is float:
        return canonical_number(value)
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return canonical_number(value)
    if isinstance(value, dict):
        return {str(key): canonical_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [canonical_value(item) for item in value]
    raise CanonicalizationError(f"not a JSON value: {type(value).__name__}")


def canonical_schema(schema: JSONValue) -> JSONValue:
    """A JSON Schema in canonical form, keeping the order of ``properties`` (see the module docstring)."""
    if isinstance(schema, dict):
        result: dict[str, JSONValue] = {}
        for key, item in schema.items():
            if key in _ORDERED_SCHEMA_MAPS and isinstance(item, dict):
                result[key] = [[str(name), canonical_schema(sub)] for name, sub in item.items()]
            else:
                result[str(key)] = canonical_schema(item)
        return result
    if isinstance(schema, list | tuple):
        return [canonical_schema(item) for item in schema]
    return canonical_value(schema)


def digest_hex(data: bytes) -> str:
    """Hex BLAKE2b-256 of ``data``: the hash of every key and signature (faster than SHA-256 on CPUs without
    SHA extensions, as measured on the project's machines, and just as collision-resistant for this use)."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def encode_canonical(value: JSONValue) -> bytes:
    """Sorted-key orjson bytes of a value that is *already* canonical (no second normalization pass)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # e.g. an int beyond 64 bits
        raise CanonicalizationError(f"value cannot be encoded as canonical JSON: {exc}") from exc


def canonical_bytes(value: JSONValue) -> bytes:
    """The bytes a key is hashed from: orjson with sorted keys, no whitespace, after :func:`canonical_value`.

    Callers that already built a canonical value may pass it directly; numbers are canonicalized again
    (cheap and idempotent) so no caller can forget it.
    """
    return encode_canonical(canonical_value(value))
