"""Batch searches answered per item: split into hits and misses, forward the misses as one batch, reassemble.

Pure functions over JSON values and bytes. Qdrant's response shapes (``{"result": R, "status": "ok", "time":
t}``):

- ``points/search`` and ``points/recommend``: ``R`` = list of scored points; their ``/batch``: list of such
  lists;
- ``points/query``: ``R`` = ``{"points": [...]}``; ``points/query/batch``: list of such objects.

An *item result* is the per-search value (a list, or the ``{"points": ...}`` object). The cache stores item
results as the orjson bytes of the value and builds responses by concatenating bytes, so a hit never re-parses
JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from normalizer.search_request import SearchEndpoint
from tiers.retrieval.writes import PointId, point_ids


@dataclass(frozen=True, slots=True)
class BatchSplit:
    """Positions (in request order) answered from the cache and those that must go upstream."""

    hits: tuple[int, ...]
    misses: tuple[int, ...]


def split(answers: Sequence[object | None]) -> BatchSplit:
    """Split by position: ``answers[i]`` is the cached answer of item ``i`` or ``None``."""
    hits = tuple(i for i, answer in enumerate(answers) if answer is not None)
    misses = tuple(i for i, answer in enumerate(answers) if answer is None)
    return BatchSplit(hits=hits, misses=misses)


def upstream_body(body: Mapping[str, Any], batch: bool, misses: Sequence[int]) -> dict[str, Any]:
    """The request for the misses only: a batch body with the missing searches in order (single: as is)."""
    if not batch:
        return dict(body)
    searches = body["searches"]
    return {**body, "searches": [searches[i] for i in misses]}


def item_results(response: bytes | Mapping[str, Any], batch: bool, count: int) -> list[Any] | None:
    """The per-item results of an upstream answer with ``count`` items; ``None`` unless a success."""
    try:
        document = orjson.loads(response) if isinstance(response, bytes | bytearray) else response
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, Mapping) or document.get("status") != "ok" or "result" not in document:
        return None
    result = document["result"]
    items = result if batch else [result]
    if not isinstance(items, list) or len(items) != count:
        return None
    return items


def result_point_ids(endpoint: SearchEndpoint, item: Any) -> frozenset[PointId] | None:
    """The ids of the points in one item result, or ``None`` when the shape is not the endpoint's."""
    points = item.get("points") if endpoint is SearchEndpoint.QUERY and isinstance(item, Mapping) else item
    if not isinstance(points, list) or not all(isinstance(p, Mapping) and "id" in p for p in points):
        return None
    return point_ids(p["id"] for p in points)


def reassemble(
    count: int, cached: Mapping[int, bytes], upstream: Sequence[bytes], misses: Sequence[int]
) -> list[bytes]:
    """Item results in request order: cached ones at their positions, upstream ones in between."""
    if len(upstream) != len(misses) or len(cached) + len(misses) != count:
        raise ValueError("cached and upstream items do not cover the request")
    ordered: list[bytes | None] = [None] * count
    for position, value in cached.items():
        ordered[position] = value
    for position, value in zip(misses, upstream, strict=True):
        ordered[position] = value
    if any(value is None for value in ordered):
        raise ValueError("a position is answered twice or not at all")
    return [value for value in ordered if value is not None]


def response_bytes(items: Sequence[bytes], batch: bool, elapsed_s: float) -> bytes:
    """A Qdrant success envelope around item results (one item when not ``batch``)."""
    if not batch and len(items) != 1:
        raise ValueError("a single search has exactly one result")
    result = b"[" + b",".join(items) + b"]" if batch else items[0]
    return b'{"result":' + result + b',"status":"ok","time":' + orjson.dumps(round(elapsed_s, 6)) + b"}"
