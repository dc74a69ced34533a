"""Hints per backend kind, slot choice, and reading back what the backend reused."""

from __future__ import annotations

import itertools

import orjson
import pytest

from normalizer.prompt_plan import Segment
from proxy.assembly.config import ConfigError, load_settings
from proxy.kv.hints import (
    SlotTable,
    capacity_from_slots,
    path_hash,
    reported_cached_tokens,
    reported_prefill,
    reported_prompt_tokens,
)
from proxy.kv.kinds import GENERIC, KINDS, LLAMACPP, OPENAI, SGLANG, VLLM, build_hints
from upstream_doubles.openai_responses import encode, response_object, stream_events

PATH = [Segment("p:s", 10), Segment("d1", 100), Segment("d2", 100)]


def test_llamacpp_gets_cache_prompt_and_a_pinned_slot_only_as_it_starts() -> None:
    hints = build_hints(LLAMACPP, PATH, document_keys=["d1", "d2"])
    assert hints.body == {"cache_prompt": True}
    assert LLAMACPP.slot_hint(2) == {"id_slot": 2}
    assert all(kind.slot_hint(2) == {} for kind in (VLLM, SGLANG, OPENAI, GENERIC))
    assert hints.headers == {"X-Prefix-Hash": path_hash(["p:s", "d1", "d2"]), "X-Prefix-Docs": "d1,d2"}


def test_shift_asks_llamacpp_to_reuse_chunks_outside_the_prefix_and_nobody_else() -> None:
    assert build_hints(LLAMACPP, PATH, shift_min_tokens=64).body == {
        "cache_prompt": True, "n_cache_reuse": 64}
    for kind in (VLLM, SGLANG, OPENAI, GENERIC):
        assert "n_cache_reuse" not in build_hints(kind, PATH, shift_min_tokens=64).body


def test_vllm_and_sglang_get_a_per_tenant_salt() -> None:
    a = build_hints(VLLM, PATH, tenant="a").body["cache_salt"]
    b = build_hints(SGLANG, PATH, tenant="b").body["cache_salt"]
    assert a != b and a == build_hints(SGLANG, PATH, tenant="a").body["cache_salt"]


def test_openai_gets_a_prompt_cache_key_from_the_path() -> None:
    key = build_hints(OPENAI, PATH).body["prompt_cache_key"]
    assert key == path_hash(["p:s", "d1", "d2"])
    assert key != build_hints(OPENAI, [PATH[0], PATH[2], PATH[1]]).body["prompt_cache_key"]


def test_a_responses_body_gets_every_body_hint_but_prompt_cache_key() -> None:
    """A Responses object echoes ``prompt_cache_key``; the other kinds' servers take their hints on that endpoint."""
    assert build_hints(OPENAI, PATH, responses=True).body == {}
    for kind in (VLLM, SGLANG, LLAMACPP, GENERIC):
        assert build_hints(kind, PATH, tenant="t", responses=True).body == build_hints(
            kind, PATH, tenant="t").body
    assert build_hints(OPENAI, PATH, responses=True).headers == build_hints(OPENAI, PATH).headers


def test_an_empty_path_names_no_prefix_but_keeps_isolation_and_cache_prompt() -> None:
    assert build_hints(OPENAI, []).body == {}
    assert build_hints(OPENAI, []).headers == {}
    assert build_hints(LLAMACPP, []).body == {"cache_prompt": True}
    salted = build_hints(VLLM, [], tenant="a").body["cache_salt"]
    assert salted == build_hints(VLLM, PATH, tenant="a").body["cache_salt"]


def test_slot_table_picks_longest_prefix_then_least_recently_used_idle_slot() -> None:
    table = SlotTable(3, clock=itertools.count().__next__)
    slot, matched = table.best(PATH)
    assert (slot, matched) == (0, 0)
    table.assign(0, PATH)
    table.release(0)
    assert table.best([PATH[0], PATH[1], Segment("d9", 5)]) == (0, 110)
    assert table.best([Segment("other", 5)])[0] == 1  # misses go to the least recently used slot
    table.assign(0, PATH)  # busy now
    assert table.best(PATH)[0] != 0


def test_reads_cached_tokens_from_openai_usage_llamacpp_timings_and_streams() -> None:
    assert reported_cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 42}}}) == 42
    assert reported_cached_tokens({"timings": {"cache_n": 7, "prompt_n": 3, "prompt_ms": 1.5}}) == 7
    assert reported_cached_tokens({"usage": {"prompt_tokens": 3}}) is None
    stream = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"timings":{"cache_n":9,"prompt_n":4,"prompt_ms":12.0}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert reported_cached_tokens(stream) == 9
    assert reported_prefill(stream) == (4, 9, 12.0)
    assert reported_cached_tokens(orjson.dumps({"timings": {"cache_n": 1}})) == 1


def test_reports_are_read_from_a_responses_object_and_from_its_completed_event() -> None:
    result = response_object({"input": "q"}, "m", [], None, 120, 5)
    result["usage"]["input_tokens_details"]["cached_tokens"] = 96
    assert reported_cached_tokens(orjson.dumps(result)) == 96
    assert reported_prompt_tokens(orjson.dumps(result)) == 120
    stream = b"".join(encode(event) for event in stream_events(result))
    assert reported_cached_tokens(stream) == 96 and reported_prompt_tokens(stream) == 120
    result["usage"] = {"input_tokens": 120, "output_tokens": 5, "total_tokens": 125}
    assert reported_cached_tokens(orjson.dumps(result)) is None, "no details: the backend did not say"


def test_capacity_from_llamacpp_slots() -> None:
    assert capacity_from_slots([{"id": 0, "n_ctx": 4096}, {"id": 1, "n_ctx": 4096}]) == (2, 8192)


def test_every_configurable_kind_is_an_adapter_and_generic_gets_no_body_hints() -> None:
    assert set(KINDS) == {"openai", "vllm", "sglang", "llamacpp", "generic"}
    assert build_hints(GENERIC, PATH, tenant="a", shift_min_tokens=64).body == {}
    assert build_hints(GENERIC, PATH).headers["X-Prefix-Hash"] == path_hash(["p:s", "d1", "d2"])
    assert [name for name, kind in KINDS.items() if kind.tracks_slots] == ["llamacpp"]
    settings = load_settings(env={}, overrides={"upstreams.llm": [{"url": "http://gateway:8000", "kind": "generic"}]})
    assert settings.upstreams.llm[0].kind == "generic"
    with pytest.raises(ConfigError, match="allowed: openai, vllm, sglang, llamacpp, generic"):
        load_settings(env={}, overrides={"upstreams.llm": [{"url": "http://x:1", "kind": "tgi"}]})
