"""Typed paths and queries (normalizer/paths.py): exact templates, typed parameters, queries rebuilt from what was
checked, the pass-through's patterns rebuilt the same way."""

from __future__ import annotations

import pytest

from normalizer.paths import (
    ITEM_ID,
    RESPONSE_ID,
    PathAllowList,
    PathTemplate,
    Query,
    QueryParameter,
    QueryProblem,
    check_pattern,
    upstream_target,
)

ITEMS = PathTemplate("/v1/responses/{response_id}/input_items", {"response_id": RESPONSE_ID})


@pytest.mark.parametrize(("path", "matched"), [
    ("/v1/responses/resp_abc123/input_items", {"response_id": "resp_abc123"}),
    ("/v1/responses/input_tokens/input_items", None), ("/v1/responses/resp_a/input_items/x", None),
    ("/v1/responses/resp_a", None), ("/v1/responses/resp_a-b/input_items", None),
    ("/v1/responses/resp_/input_items", None), ("/v1/responses/resp_a/input_items/", None),
])
def test_a_template_matches_exactly_and_by_type(path: str, matched: dict[str, str] | None) -> None:
    assert ITEMS.match(path) == matched


def test_a_query_is_rebuilt_from_its_typed_parameters() -> None:
    query = Query((QueryParameter(("after",), ITEM_ID), QueryParameter(("tag", "tag[]"), ITEM_ID, repeated=True)))
    assert query.rebuild("after=msg_1&tag[]=fc_2&tag=rs_3") == "after=msg_1&tag%5B%5D=fc_2&tag=rs_3"
    assert query.rebuild("") == ""
    for bad, param in (("after=..%2Fx", "after"), ("other=1", "other"), ("after=msg_1&after=msg_2", "after")):
        with pytest.raises(QueryProblem) as problem:
            query.rebuild(bad)
        assert problem.value.param == param
    with pytest.raises(QueryProblem):
        query.rebuild("after")  # not name=value


def test_the_target_is_built_never_copied() -> None:
    target = upstream_target(ITEMS, Query((QueryParameter(("after",), ITEM_ID),)), "/v1/responses/resp_1/input_items",
                             "after=%6Dsg_1")
    assert target is not None and target.path == "/v1/responses/resp_1/input_items?after=msg_1"
    assert target.params == {"response_id": "resp_1"}


def test_pass_through_patterns_are_typed_and_rebuilt() -> None:
    allowed = PathAllowList(["GET /v1/models", "GET /v1/models/*", "* /v1/batches/*/cancel"])
    target = allowed.target("GET", "/v1/models/llama3:8b", "x=%2e%2e")
    assert target is not None and target.path == "/v1/models/llama3:8b?x=.."
    assert allowed.allows("POST", "/v1/batches/b1/cancel")
    assert not allowed.allows("GET", "/v1/models/.hidden") and not allowed.allows("GET", "/v1/models/a b")
    for bad in ("GET /v1/models/{x}", "GET /v1/models/%2e", "GET /v1/../x", "GET /v1/a;b"):
        with pytest.raises(ValueError):
            check_pattern(bad)
