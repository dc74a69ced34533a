"""Property tests of exact-cache keys in both directions: equivalent encodings share a key, edits never do."""

from __future__ import annotations

import copy
import re

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from normalizer.canonical import KeyScope, cache_key, canonical_chat, canonical_embedding_items
from normalizer.canonical_json import canonical_bytes, encode_canonical
from tests.normalizer.request_strategies import MUTATIONS, Spec, chat_specs, encodings

SCOPE = KeyScope(tenant="acme", namespace="default", knowledge_version="7")
PROPERTY_SETTINGS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chat_key(body: Spec, scope: KeyScope = SCOPE) -> str:
    return cache_key("chat", canonical_chat(body), scope)


@PROPERTY_SETTINGS
@given(spec=chat_specs(), data=st.data())
def test_equivalent_encodings_share_one_key(spec: Spec, data: st.DataObject) -> None:
    first = data.draw(encodings(spec), label="first encoding")
    second = data.draw(encodings(spec), label="second encoding")
    assert chat_key(first) == chat_key(second) == chat_key(spec)
    canonical = canonical_chat(first)
    assert encode_canonical(canonical) == canonical_bytes(canonical)  # already canonical: safe to hash as is


@PROPERTY_SETTINGS
@given(spec=chat_specs(), mutation=st.sampled_from(sorted(MUTATIONS)), data=st.data())
def test_an_answer_changing_edit_changes_the_key(spec: Spec, mutation: str, data: st.DataObject) -> None:
    edited = copy.deepcopy(spec)
    MUTATIONS[mutation](edited, data.draw)
    before = data.draw(encodings(spec), label="original encoding")
    after = data.draw(encodings(edited), label="edited encoding")
    assert chat_key(before) != chat_key(after)


@PROPERTY_SETTINGS
@given(
    spec=chat_specs(),
    scopes=st.lists(
        st.builds(KeyScope, st.text(max_size=6), st.text(max_size=6), st.text(max_size=3)),
        min_size=2,
        max_size=2,
        unique=True,
    ),
)
def test_each_scope_gets_its_own_key(spec: Spec, scopes: list[KeyScope]) -> None:
    first, second = (chat_key(spec, scope) for scope in scopes)
    assert first != second
    assert first.startswith(scopes[0].prefix())


def test_a_colon_in_a_scope_component_cannot_forge_another_scope() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert chat_key(body, KeyScope("a:b", "c")) != chat_key(body, KeyScope("a", "b:c"))


def test_key_format() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    key = chat_key(body, KeyScope("tenant one", "docs", "3"))
    assert re.fullmatch(r"rp5:tenant%20one:docs:3:chat:[0-9a-f]{64}", key)


@PROPERTY_SETTINGS
@given(
    inputs=st.lists(st.one_of(st.text(max_size=8), st.lists(st.integers(0, 5000), min_size=1, max_size=4))),
    dimensions=st.one_of(st.none(), st.integers(1, 3072)),
)
def test_an_embedding_batch_is_keyed_per_item_like_single_requests(
    inputs: list[str | list[int]], dimensions: int | None
) -> None:
    extra = {} if dimensions is None else {"dimensions": dimensions}
    batch = canonical_embedding_items({"model": "e", "input": inputs, **extra})
    singles = [canonical_embedding_items({"model": "e", "input": [item], **extra})[0] for item in inputs]
    assert [cache_key("embedding", c, SCOPE) for c in batch] == [
        cache_key("embedding", c, SCOPE) for c in singles
    ]
    distinct_inputs = {orjson.dumps(item) for item in inputs}
    assert len({cache_key("embedding", c, SCOPE) for c in batch}) == len(distinct_inputs)
