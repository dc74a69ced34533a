"""Comparing answers as the SDKs parse them: nested objects without the fields that differ on every call."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def without(obj: Any, fields: Collection[str]) -> Any:
    """``obj`` (dicts and lists, nested) with every key in ``fields`` left out, at any depth."""
    if isinstance(obj, dict):
        return {k: without(v, fields) for k, v in obj.items() if k not in fields}
    if isinstance(obj, list):
        return [without(v, fields) for v in obj]
    return obj
