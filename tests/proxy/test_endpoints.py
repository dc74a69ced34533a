"""The endpoint rows: each API of the data plane has exactly one, every stage of its pipeline gets that one, and each
LLM API's reads, completes and replays its own API's bodies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from normalizer.documents import DocumentRegistry, PromptDocuments
from normalizer.signature import CHAT_READING, RESPONSE_READING
from proxy.answers.replies import complete_body
from proxy.assembly.app import DataPlane
from proxy.assembly.config import load_settings
from proxy.core.endpoints import CHAT, COMPLETIONS, ENDPOINTS, RESPONSES, Endpoint, for_entry
from proxy.core.reply import Reply
from tiers.entry import CachedResponse
from upstream_doubles.openai_responses import response_object

QUESTION = "How tall is the tower?"
DOCUMENTS = {name: " ".join(f"{name}{i}" for i in range(100)) for name in ("alpha", "beta")}
CHAT_BODY = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": QUESTION}]}
RESPONSE_BODY = {"model": "m", "instructions": "Be brief.", "input": QUESTION}
CHAT_ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "330 m."},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}


def _response(status: str = "completed", **request: Any) -> dict[str, Any]:
    answer = response_object({**RESPONSE_BODY, **request}, "m", [], None, 9, 3, response_id="resp_1")
    answer["status"] = status
    return answer


def _prompt(endpoint: Endpoint, body: dict[str, Any]) -> PromptDocuments:
    assert endpoint.read_prompt is not None
    return endpoint.read_prompt(body, None, None)


def test_every_endpoint_row_is_served_at_its_paths_and_its_stages_get_it(tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"data_dir": str(tmp_path), "cache.stale.namespaces": ["default"]})
    plane = DataPlane(settings)
    paths = [path for e in ENDPOINTS for path in e.paths]
    assert len({e.route for e in ENDPOINTS}) == len(ENDPOINTS) and len(set(paths)) == len(paths)
    assert list(plane.pipelines.served) == list(ENDPOINTS)
    for endpoint in ENDPOINTS:
        for path in endpoint.paths:
            assert ("POST", path) in plane._exact
    for name, pipeline in plane.pipelines.by_route().items():
        given = {id(stage.endpoint) for stage in pipeline.stages if hasattr(stage, "endpoint")}
        owners = [e for e in ENDPOINTS if e.route == name]
        assert given == {id(e) for e in owners}, name  # its own endpoint, or none for a pipeline of no row
    stages = {name: pipeline.names for name, pipeline in plane.pipelines.by_route().items()}
    for endpoint in (CHAT, RESPONSES):
        assert {"prompt", "stale_if_error", "store", "l1", "l3", "l2", "coalesce", "shape", "route"} \
            <= set(stages[endpoint.route])
    assert {"store", "l1", "l3"} <= set(stages["completions"])
    assert not {"prompt", "l2", "shape", "route"} & set(stages["completions"])
    assert stages["embeddings"][-1] == "embedding_items" and stages["rerank"][-1] == stages["score"][-1] \
        == "rerank_items"
    assert "stored_responses" in stages["responses"] and "stored_responses" not in stages["chat"]


def test_the_cache_layer_names_keep_the_values_stored_entries_carry() -> None:
    assert {("chat", "chat"), ("completions", "completion"), ("responses", "response"), ("embeddings", "embedding"),
            ("rerank", "rerank"), ("score", "rerank")} <= {(e.route, e.kind) for e in ENDPOINTS}  # a new row adds one
    for endpoint in (CHAT, COMPLETIONS, RESPONSES):
        assert for_entry(CachedResponse(body=b"{}", kind=endpoint.kind)) is endpoint
    with pytest.raises(KeyError):
        for_entry(CachedResponse(body=b"[]", kind="no such kind"))


def test_each_endpoint_reads_its_own_prompt_and_final_question() -> None:
    assert CHAT.read_question(CHAT_BODY, _prompt(CHAT, CHAT_BODY)) == QUESTION
    assert RESPONSES.read_question(RESPONSE_BODY, _prompt(RESPONSES, RESPONSE_BODY)) == QUESTION
    assert RESPONSES.read_question({**RESPONSE_BODY, "input": []}, _prompt(RESPONSES, RESPONSE_BODY)) is None
    assert CHAT.reading is CHAT_READING and RESPONSES.reading is RESPONSE_READING
    assert COMPLETIONS.read_prompt is None and COMPLETIONS.reading is None


def test_a_responses_answer_is_complete_only_when_completed_or_incomplete() -> None:
    reply = Reply(200, headers={"Content-Type": "application/json"})
    for status, stored in [("completed", True), ("incomplete", True), ("queued", False), ("in_progress", False),
                           ("failed", False)]:
        body = orjson.dumps(_response(status))
        assert (complete_body(reply, body, RESPONSES) is not None) is stored, status
        assert complete_body(reply, body, CHAT) is not None  # a chat answer has no status to wait for
    assert complete_body(reply, orjson.dumps({**CHAT_ANSWER, "error": {"message": "x"}}), CHAT) is None


def test_a_cached_chat_answer_is_its_body_or_a_replayed_stream() -> None:
    entry = CachedResponse(body=orjson.dumps(CHAT_ANSWER), kind="chat")
    assert CHAT.answer(entry, CHAT_BODY, stream=False) is entry.body
    events = CHAT.answer(entry, {**CHAT_BODY, "stream_options": {"include_usage": True}}, stream=True)
    assert isinstance(events, list) and events[-1] == b"data: [DONE]\n\n"
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "330 m."
    assert chunks[-1]["usage"]["total_tokens"] == 12  # asked for: the usage chunk comes last


def test_a_cached_response_echoes_the_request_and_replays_typed_events() -> None:
    entry = CachedResponse(body=orjson.dumps(_response()), kind="response")
    assert RESPONSES.answer(entry, RESPONSE_BODY, stream=False) is entry.body  # nothing of its own to echo
    echoed = RESPONSES.answer(entry, {**RESPONSE_BODY, "metadata": {"ticket": "7"}}, stream=False)
    assert isinstance(echoed, bytes) and orjson.loads(echoed)["metadata"] == {"ticket": "7"}
    events = RESPONSES.answer(entry, RESPONSE_BODY, stream=True)
    assert isinstance(events, list)
    assert b"event: response.created" in events[0] and b"event: response.completed" in events[-1]


def test_only_a_stored_response_is_owned_named_and_bounded_by_the_upstreams_retention() -> None:
    body = orjson.dumps(_response())
    assert RESPONSES.owned is not None and RESPONSES.owned(RESPONSE_BODY)  # ``store`` defaults to true
    assert RESPONSES.stored_id(RESPONSE_BODY, body) == "resp_1"
    assert RESPONSES.stored_id({**RESPONSE_BODY, "store": False}, body) is None
    lifetime = RESPONSES.lifetime(3600.0)
    assert lifetime is not None and lifetime(RESPONSE_BODY) == 3600.0 and lifetime({"store": False}) is None
    for endpoint in (CHAT, COMPLETIONS):
        assert endpoint.owned is None and endpoint.lifetime(3600.0) is None
        assert endpoint.stored_id({"store": True}, body) is None


def test_kv_planning_follows_the_endpoint() -> None:
    """The same instructions and documents: chat re-renders its messages in the order chosen, a Responses body goes
    out as sent (planned from its chat view), and one continuing a stored response is not planned."""
    known = DocumentRegistry()
    for name, text in DOCUMENTS.items():
        known.add(text, name)
    context = "\n".join(f"[{i + 1}] {text}" for i, text in enumerate(DOCUMENTS.values()))
    text = f"Context:\n{context}\nQuestion: {QUESTION}"
    chat_body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": text}]}
    response_body = {"model": "m", "instructions": "Be brief.", "input": text}
    assert CHAT.read_prompt is not None and RESPONSES.read_prompt is not None
    chat = CHAT.plan(chat_body, CHAT.read_prompt(chat_body, None, known))
    response = RESPONSES.plan(response_body, RESPONSES.read_prompt(response_body, None, known))
    assert chat is not None and response is not None
    assert [d.key for d in chat.documents] == [d.key for d in response.documents] and len(chat.documents) == 2
    assert chat.prefix == response.prefix
    assert chat.rewrites and not response.rewrites
    assert RESPONSES.forwarded_as_sent and not CHAT.forwarded_as_sent
    continued = {**response_body, "previous_response_id": "resp_0"}
    assert RESPONSES.plan(continued, RESPONSES.read_prompt(continued, None, known)) is None


_BRANCH_ON_NAME = re.compile(r"\b(route|kind)\s*(==|!=|in|not in)\s*[(\[{]?[\"'](chat|completions?|responses?|"
                             r"embeddings?|rerank|score)[\"']")


def test_no_module_branches_on_an_endpoint_name() -> None:
    """What differs between APIs is a fact of their row, handed to the code that needs it: nothing in the
    normalizer or the proxy compares a route or kind with an endpoint's name."""
    root = Path(__file__).resolve().parents[2]
    found = [f"{path.relative_to(root)}:{number}" for folder in ("normalizer", "proxy")
             for path in sorted((root / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if _BRANCH_ON_NAME.search(line)]
    assert found == []


def test_an_answer_streamed_without_usage_serves_only_requests_that_do_not_ask_for_it() -> None:
    """A stream that reported no usage is stored marked so; a JSON request, or a stream with ``include_usage``,
    is not answered from it (it goes upstream, and that answer replaces it)."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "330 m."}}]},
              {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    raw = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    streamed = Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=_no_chunks())
    without = complete_body(streamed, raw, CHAT)
    assert without is not None and without.meta["no_usage"] is True
    entry = CachedResponse(body=without.body, kind="chat", meta=without.meta)
    asks = {**CHAT_BODY, "stream_options": {"include_usage": True}}
    assert CHAT.carries(entry, CHAT_BODY, stream=True)
    assert not CHAT.carries(entry, CHAT_BODY, stream=False) and not CHAT.carries(entry, asks, stream=True)
    usage = {**chunk, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    withheld = Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=_no_chunks(),
                     withheld=[b"data: " + orjson.dumps(usage) + b"\n\n"])
    whole = complete_body(withheld, raw, CHAT)
    assert whole is not None and "no_usage" not in whole.meta, "the usage chunk kept from the client is stored"
    assert orjson.loads(whole.body)["usage"]["total_tokens"] == 7
    assert CHAT.carries(CachedResponse(body=whole.body, kind="chat", meta=whole.meta), asks, stream=True)


async def _no_chunks() -> Any:
    yield b""
