"""Assembly: every pipeline the proxy builds passes the slot check, and a misordered one is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.assembly import build_pipelines
from proxy.config import load_settings
from proxy.context import Reply, RequestContext
from proxy.kv.stages import Shape
from proxy.pipeline import Pipeline
from proxy.runtime import Runtime
from proxy.stages.prompt import ReadPrompt


async def _terminal(ctx: RequestContext) -> Reply:
    return Reply(200)


def test_a_stage_placed_before_the_producer_of_what_it_reads_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'shape' needs \['prompt'\]"):
        Pipeline([Shape([]), ReadPrompt(None)], _terminal)
    Pipeline([ReadPrompt(None), Shape([])], _terminal)


def test_a_stage_naming_a_slot_the_context_lacks_is_refused() -> None:
    class Typo:
        name, needs, gives = "typo", frozenset({"documnets"}), frozenset[str]()

        async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
            return await call_next(ctx)

    with pytest.raises(ValueError, match="unknown context slots"):
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
    assert "prompt" in pipelines.chat.names or not (settings.cache.enabled or settings.routing.enabled)


@pytest.mark.parametrize("routing", [True, False], ids=["routing", "no routing"])
def test_responses_requests_take_the_kv_stages_where_chat_does(routing: bool, tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"data_dir": str(tmp_path), "cache.l2.enabled": False,
                                                "routing.enabled": routing})
    pipelines = build_pipelines(Runtime(settings))
    for pipeline in (pipelines.chat, pipelines.responses):
        assert (pipeline.names[-2:] == ["shape", "route"]) is routing
