"""Assembly: every pipeline the proxy builds passes the slot check, and a misordered one is refused (on the way in
and on the way back), for the context's slots and the features' handoff keys alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.answers.replies import StoreResponse
from proxy.answers.stale import StaleIfError, StaleStore
from proxy.assembly.config import load_settings
from proxy.assembly.pipelines import build_pipelines
from proxy.assembly.runtime import Runtime
from proxy.core.context import Handoff, Reply, RequestContext
from proxy.core.endpoints import CHAT, RESPONSES
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.order import OrderPolicy
from proxy.kv.stages import Shape
from proxy.server.request import Request


async def _terminal(ctx: RequestContext) -> Reply:
    return Reply(200)


def test_a_stage_placed_before_the_producer_of_what_it_reads_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'shape' needs \['prompt'\]"):
        Pipeline([Shape([], default_policy=OrderPolicy.PRESERVE), ReadPrompt(None)], _terminal)
    Pipeline([ReadPrompt(None), Shape([], default_policy=OrderPolicy.PRESERVE)], _terminal)


def test_a_stage_naming_a_slot_the_context_lacks_is_refused() -> None:
    class Typo:
        name, needs, gives = "typo", frozenset({"documnets"}), frozenset[str]()

        async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
            return await call_next(ctx)

    with pytest.raises(ValueError, match="unknown context slots"):
        Pipeline([Typo()], _terminal)


class _Keyed:
    """Gives what the cache stages need on the way in (the key and the policy), nothing of the outcome."""

    name, needs, gives = "keyed", frozenset[str](), frozenset({"cache_key", "cache_policy"})

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
        return await call_next(ctx)


def _stale() -> StaleIfError:
    return StaleIfError(StaleStore(), endpoint=CHAT, namespaces=["docs"])


def test_a_stage_reading_an_outcome_no_later_stage_gives_is_refused() -> None:
    """stale_if_error keeps answers the store marked MISS/REFRESH on the way back: without the store, or with the
    store outside it (it marks the status after stale_if_error has read it), it could never keep one."""
    with pytest.raises(ValueError, match=r"'stale_if_error' reads \['outcome'\] on the way back"):
        Pipeline([_Keyed(), _stale()], _terminal)
    with pytest.raises(ValueError, match=r"'stale_if_error' reads \['outcome'\] on the way back"):
        Pipeline([_Keyed(), StoreResponse(None, endpoint=CHAT), _stale()], _terminal)


def test_a_stage_reading_an_outcome_a_later_stage_gives_is_assembled() -> None:
    pipeline = Pipeline([_Keyed(), _stale(), StoreResponse(None, endpoint=CHAT)], _terminal)
    assert pipeline.names == ["keyed", "stale_if_error", "store"]


def test_an_outcome_read_only_if_given_needs_no_writer() -> None:
    """The store reads the status only to leave a hit alone: with no lookup behind it, every answer is a miss."""
    assert "outcome" in StoreResponse(None, endpoint=CHAT).reads_if_given
    Pipeline([_Keyed(), StoreResponse(None, endpoint=CHAT)], _terminal)


def test_a_way_back_read_naming_a_slot_the_context_lacks_is_refused() -> None:
    class Typo(_Keyed):
        name, reads = "typo", frozenset({"cache_stauts"})

    with pytest.raises(ValueError, match=r"unknown context slots \['cache_stauts'\]"):
        Pipeline([Typo()], _terminal)


@pytest.mark.parametrize("overrides", [
    {},
    {"routing.enabled": False},
    {"cache.enabled": False},
    {"cache.l1.enabled": False, "cache.l3.enabled": False},
    {"cache.enabled": False, "routing.enabled": False, "credits.enabled": True},
    {"cache.stale.namespaces": ["docs"], "credits.enabled": True, "upstreams.qdrant.url": "http://127.0.0.1:1"},
], ids=["defaults", "no routing", "no cache", "no exact tiers", "nothing but credits", "stale, credits, qdrant"])
def test_every_assembled_pipeline_passes_the_slot_check(overrides: dict[str, Any], tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"data_dir": str(tmp_path), "cache.l2.enabled": False, **overrides})
    pipelines = build_pipelines(Runtime(settings))
    assert "prompt" in pipelines.served[CHAT].names or not (settings.cache.enabled or settings.routing.enabled)


@pytest.mark.parametrize("routing", [True, False], ids=["routing", "no routing"])
def test_responses_requests_take_the_kv_stages_where_chat_does(routing: bool, tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"data_dir": str(tmp_path), "cache.l2.enabled": False,
                                                "routing.enabled": routing})
    pipelines = build_pipelines(Runtime(settings))
    for pipeline in (pipelines.served[CHAT], pipelines.served[RESPONSES]):
        assert (pipeline.names[-2:] == ["shape", "route"]) is routing


ANSWER: Handoff[int] = Handoff("answer")
"""A handoff a feature would declare in its own module: nothing in the core names it."""


class _Giver:
    name, needs, gives = "giver", frozenset[str](), frozenset({ANSWER})

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
        ctx.handoffs[ANSWER] = 42
        return await call_next(ctx)


class _Reader:
    name, needs, gives = "reader", frozenset({ANSWER}), frozenset[str]()
    seen: int | None = None

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
        self.seen = ctx.handoffs.get(ANSWER)
        return await call_next(ctx)


def test_a_reader_of_a_feature_handoff_placed_before_its_giver_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'reader' needs \['answer'\], which no earlier stage gives"):
        Pipeline([_Reader(), _Giver()], _terminal)
    with pytest.raises(ValueError, match=r"'reader' needs \['answer'\]"):
        Pipeline([_Reader()], _terminal)


async def test_a_feature_handoff_reaches_its_reader_through_the_context() -> None:
    reader = _Reader()
    ctx = RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id="r")
    assert ctx.handoffs.get(ANSWER) is None, "not given: None"
    await Pipeline([_Giver(), reader], _terminal)(ctx)
    assert reader.seen == 42


def test_keys_are_told_apart_by_identity_not_name() -> None:
    """Two features choosing the same name do not satisfy each other's readers."""

    class Other(_Giver):
        gives = frozenset({Handoff[int]("answer")})

    with pytest.raises(ValueError, match=r"'reader' needs \['answer'\]"):
        Pipeline([Other(), _Reader()], _terminal)


def test_a_way_back_read_of_a_feature_handoff_needs_a_later_giver() -> None:
    class Back(_Keyed):
        name, reads = "back", frozenset({ANSWER})

    with pytest.raises(ValueError, match=r"'back' reads \['answer'\] on the way back"):
        Pipeline([_Giver(), Back()], _terminal)
    Pipeline([Back(), _Giver()], _terminal)

