"""Which Qdrant requests invalidate cached searches, and how much."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tiers.retrieval.writes import WriteEffect, WriteScope, canonical_point_id, write_effects

UUID = "5C56C793-69F3-4FBF-87E6-C4BF54C28C26"


def effects(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[WriteEffect, ...]:
    return write_effects(method, path, orjson.dumps(body) if body is not None else None)


def effect(method: str, path: str, body: dict[str, Any] | None = None) -> WriteEffect | None:
    """The one effect of a request (``None``: it only reads)."""
    found = effects(method, path, body)
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/collections/docs"),
        ("POST", "/collections/docs/points/search"),
        ("POST", "/collections/docs/points/search/batch"),
        ("POST", "/collections/docs/points/query/groups"),
        ("POST", "/collections/docs/points/recommend"),
        ("POST", "/collections/docs/points/scroll"),
        ("POST", "/collections/docs/points/count"),
        ("POST", "/collections/docs/points"),  # retrieve by ids
        ("POST", "/collections/docs/facet"),
    ],
)
def test_reads_invalidate_nothing(method: str, path: str) -> None:
    assert effect(method, path, {}) is None


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/collections/docs", {"vectors": {"size": 4, "distance": "Dot"}}),
        ("DELETE", "/collections/docs", None),
        ("PATCH", "/collections/docs", {"optimizers_config": {}}),
        ("PUT", "/collections/docs/points", {"points": [{"id": 1, "vector": [0.1]}]}),
        ("PUT", "/collections/docs/points?wait=true", {"points": [{"id": 1, "vector": [0.1]}]}),
        ("POST", "/collections/docs/points/batch", {"operations": []}),
        ("PUT", "/collections/docs/points/vectors", {"points": [{"id": 1, "vector": [0.1]}]}),
        ("POST", "/collections/docs/points/delete", {"filter": {"must": []}}),
        ("POST", "/collections/docs/points/payload", {"payload": {"a": 1}, "filter": {"must": []}}),
        ("POST", "/collections/docs/points/payload/clear", {"points": ["not-an-id"]}),
        ("PUT", "/collections/docs/index", {"field_name": "a", "field_schema": "keyword"}),
        ("PUT", "/collections/docs/snapshots/recover", {"location": "file:///x"}),
    ],
)
def test_collection_wide_writes(method: str, path: str, body: dict[str, Any] | None) -> None:
    assert effect(method, path, body) == WriteEffect(WriteScope.COLLECTION, "docs")


def test_deletes_by_id() -> None:
    found = effect("POST", "/collections/docs/points/delete?wait=true", {"points": [1, UUID]})
    assert found == WriteEffect(WriteScope.POINTS_REMOVED, "docs", frozenset({1, UUID.lower()}))
    found = effect("POST", "/collections/docs/points/vectors/delete", {"points": [3], "vector": ["v"]})
    assert found == WriteEffect(WriteScope.POINTS_REMOVED, "docs", frozenset({3}))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/collections/docs/points/payload"),
        ("PUT", "/collections/docs/points/payload"),
        ("POST", "/collections/docs/points/payload/delete"),
        ("POST", "/collections/docs/points/payload/clear"),
    ],
)
def test_payload_changes_by_id(method: str, path: str) -> None:
    found = effect(method, path, {"payload": {"a": 1}, "keys": ["a"], "points": [4, 5]})
    assert found == WriteEffect(WriteScope.PAYLOAD_CHANGED, "docs", frozenset({4, 5}))


def test_alias_changes_drop_the_searches_made_through_those_names() -> None:
    actions = {"actions": [{"create_alias": {"alias_name": "a1", "collection_name": "docs"}},
                           {"delete_alias": {"alias_name": "a2"}},
                           {"rename_alias": {"old_alias_name": "a3", "new_alias_name": "a4"}}]}
    assert effects("POST", "/collections/aliases", actions) == tuple(
        WriteEffect(WriteScope.COLLECTION, name) for name in ("a1", "a2", "a3", "a4"))
    assert effects("POST", "/collections/aliases", {"actions": []}) == ()


def test_unreadable_alias_changes_and_unknown_writes_drop_everything() -> None:
    assert effect("POST", "/collections/aliases", {"actions": "x"}) == WriteEffect(WriteScope.ALL)
    assert effect("POST", "/collections/aliases", {"actions": [{"create_alias": 5}]}) == WriteEffect(WriteScope.ALL)
    assert effect("POST", "/cluster/recover", {}) == WriteEffect(WriteScope.ALL)


def test_point_ids_are_canonical() -> None:
    assert canonical_point_id(UUID) == UUID.lower()
    assert canonical_point_id("5c56c79369f34fbf87e6c4bf54c28c26") == UUID.lower()
    assert canonical_point_id(7) == 7
    assert canonical_point_id(True) is None
    assert canonical_point_id("x") is None
