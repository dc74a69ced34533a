"""Requests are built, not relayed: each finding of issue 47 through HTTP against a real proxy, in front of an
upstream that reads requests the way common stacks do (:class:`~upstream_doubles.lenient_llm.LenientFakeLLM`: the
path decoded twice, ``;`` parameters dropped, ``X-Original-URL`` and ``X-HTTP-Method-Override`` honoured, JSON
read leniently), with the official openai SDK or httpx (raw sockets for paths httpx would clean up).

Each of these passed upstream on the code before it: free chat completions through paths under
``/v1/responses/``, another tenant's stored response read and deleted, ``compact`` and ``input_tokens`` unbilled,
bodies the proxy could not parse forwarded, override headers forwarded, ``background`` billed on its queued object,
``item_reference`` to another tenant's items."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from normalizer.json_body import read_body
from proxy.core.outcome import MICRO
from proxy.credits.store import ledger_entries
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.lenient_llm import LenientFakeLLM

MODEL = "fake-model"
CHAT = "/v1/chat/completions"
BIG = 8 * 1024 * 1024


@pytest.fixture
def lenient() -> Iterator[LenientFakeLLM]:
    with LenientFakeLLM() as llm:
        yield llm


class Billed:
    """A proxy with API keys and credits in front of ``upstream``; tenants ``acme`` (ann) and ``globex`` (bob), and
    ``broke`` (acme, no credits)."""

    def __init__(self, proxy: ProxyServer, upstream: LenientFakeLLM) -> None:
        self.proxy, self.upstream = proxy, upstream
        self.ann, self.bob, self.broke = (self.key(user, tenant, credits) for user, tenant, credits in
                                          (("ann", "acme", 100), ("bob", "globex", 100), ("broke", "acme", 0)))

    def key(self, user: str, tenant: str, credits: float) -> dict[str, str]:
        runtime = self.proxy.runtime
        assert runtime.credits.keys is not None and runtime.credits.store is not None
        created = self.proxy.call(runtime.credits.keys.create(user, tenant))
        if credits:
            self.proxy.call(runtime.credits.store.top_up(user, int(credits * MICRO), tenant=tenant))
        return {"Authorization": f"Bearer {created.plaintext}"}

    def client(self, headers: dict[str, str]) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.proxy.url + "/v1", api_key=headers["Authorization"][7:], max_retries=0)

    def charges(self, user: str) -> list[Any]:
        async def entries() -> list[Any]:
            store = self.proxy.runtime.credits.store
            assert store is not None
            return [entry async for entry in ledger_entries(store) if entry.user == user and entry.kind == "charge"]
        return self.proxy.call(entries())

    def reached(self) -> list[tuple[str, str]]:
        """What the upstream acted on, less the proxy's health probes."""
        return [(entry.method, entry.path) for entry in self.upstream.log.entries
                if (entry.method, entry.path) != ("GET", "/v1/models")]

    def raw(self, method: str, target: str, headers: dict[str, str], body: bytes = b"",
            content_type: str | None = "application/json") -> tuple[int, Any]:
        """One request with ``target`` sent as written; its status and JSON body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.proxy.settings.server.port, timeout=30)
        try:
            connection.putrequest(method, target, skip_accept_encoding=True)
            for name, value in {**headers, **({"Content-Type": content_type} if content_type else {}),
                                "Content-Length": str(len(body))}.items():
                connection.putheader(name, value)
            connection.endheaders(body)
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            connection.close()


@pytest.fixture
def billed(lenient: LenientFakeLLM, tmp_path: Path) -> Iterator[Billed]:
    settings = proxy_settings(lenient.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path), "cache.enabled": False,
        "credits.sqlite_synchronous": "NORMAL", "server.max_body_bytes": 16 * 1024 * 1024})
    with ProxyServer(settings) as proxy:
        yield Billed(proxy, lenient)


@pytest.mark.parametrize("target", [
    "/v1/responses/input_tokens/%252e%252e/%252e%252e/chat/completions",
    "/v1/responses/input_tokens/..;/..;/chat/completions",
    "/v1/responses/compact/%c0%ae%c0%ae/%c0%ae%c0%ae/chat/completions",
    "/v1/responses/resp_1/input_items/%252e%252e/%252e%252e/%252e%252e/chat/completions",
    "/v1/responses/compact;/../chat/completions",
])
def test_no_path_under_responses_reaches_another_route(billed: Billed, target: str) -> None:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "free answer?"}]})
    status, answer = billed.raw("POST", target, billed.broke, body)
    assert status == 400 and answer["error"]["code"] == "bad_path", (status, answer)
    assert billed.reached() == [] and billed.upstream.reread == [], "nothing reached the upstream"


def test_another_tenant_cannot_read_or_delete_through_a_path_trick(billed: Billed) -> None:
    mine = billed.client(billed.ann).responses.create(model=MODEL, input="Ann's secret plan")
    before = billed.reached()
    for method in ("GET", "DELETE"):
        for target in (f"/v1/responses/input_tokens/%252e%252e/{mine.id}", f"/v1/responses/compact/..;/{mine.id}"):
            status, answer = billed.raw(method, target, billed.bob)
            assert status == 400 and answer["error"]["code"] == "bad_path", (method, target, status)
    assert billed.reached() == before
    assert billed.client(billed.ann).responses.retrieve(mine.id).id == mine.id, "still Ann's, still there"


def test_only_the_rows_are_served_under_responses(billed: Billed) -> None:
    mine = billed.client(billed.ann).responses.create(model=MODEL, input="Ann's question")
    before = billed.reached()
    for method, path in (("GET", f"/v1/responses/{mine.id}/items"), ("GET", f"/v1/responses/{mine.id}/input_items/x"),
                         ("POST", "/v1/responses/input_tokens/x"), ("GET", "/v1/responses/not-an-id"),
                         ("POST", f"/v1/responses/{mine.id}/compact"), ("GET", "/v1/responses/input_tokens")):
        refused = httpx.request(method, billed.proxy.url + path, headers=billed.ann, json={"model": MODEL})
        assert refused.status_code in (404, 405), (method, path, refused.status_code)
        if refused.status_code == 404:
            assert refused.json()["error"]["message"] == f"Invalid URL ({method} {path})"
    patched = httpx.patch(f"{billed.proxy.url}/v1/responses/{mine.id}", headers=billed.ann)
    assert patched.status_code == 405 and patched.headers["Allow"] == "DELETE,GET"
    assert billed.reached() == before, "nothing the rows do not name reached the upstream"


def test_the_upstream_query_is_rebuilt_from_typed_parameters(billed: Billed) -> None:
    ann = billed.client(billed.ann)
    mine = ann.responses.create(model=MODEL, input=[{"role": "user", "content": "one"},
                                                    {"role": "user", "content": "two"}])
    page = ann.responses.input_items.list(mine.id, limit=1, order="asc", include=["message.input_image.image_url"])
    assert len(page.data) == 1
    seen = billed.upstream.log.for_path(f"/v1/responses/{mine.id}/input_items")[-1]
    assert seen.query == {"limit": "1", "order": "asc", "include[]": "message.input_image.image_url"}
    url = f"{billed.proxy.url}/v1/responses/{mine.id}/input_items"
    for query, param in (("limit=500", "limit"), ("order=sideways", "order"), ("after=../x", "after"),
                         ("stream=true", "stream"), ("limit=1&limit=2", "limit")):
        refused = httpx.get(f"{url}?{query}", headers=billed.ann)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, (query, refused.text)
    chat = httpx.post(billed.proxy.url + CHAT + "?x-http-method-override=DELETE", headers=billed.ann,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "unknown_parameter"


def test_compact_and_input_tokens_are_priced_and_bounded(billed: Billed) -> None:
    broke = billed.client(billed.broke)
    with pytest.raises(openai.APIStatusError) as compact_refused:
        broke.responses.compact(model=MODEL, input="summarise this")
    with pytest.raises(openai.APIStatusError) as count_refused:
        broke.responses.input_tokens.count(model=MODEL, input="count this")
    assert compact_refused.value.status_code == count_refused.value.status_code == 429
    assert billed.reached() == []
    ann = billed.client(billed.ann)
    compacted = ann.responses.compact(model=MODEL, input="a long conversation to summarise for later")
    counted = ann.responses.input_tokens.count(model=MODEL, input="count these words")
    assert compacted.usage.output_tokens > 0 and counted.input_tokens > 0
    compact_charge, count_charge = billed.charges("ann")
    assert (compact_charge.usage_source, compact_charge.completion_tokens) == ("reported",
                                                                               compacted.usage.output_tokens)
    assert count_charge.model == "request" and count_charge.cost == billed.proxy.runtime.credits.prices.request_cost()
    huge = httpx.post(billed.proxy.url + "/v1/responses/input_tokens", headers=billed.ann, timeout=60,
                      content=orjson.dumps({"model": MODEL, "input": "x " * (BIG // 2)}))
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("path", ["/v1/responses/compact", "/v1/responses/input_tokens", "/v1/responses", CHAT])
@pytest.mark.parametrize(("content_type", "body"), [
    ("text/plain", b'{"model": "fake-model", "input": "hi", "previous_response_id": "PREVIOUS"}'),
    ("application/json", b'{"model": "fake-model", "input": "hi", "temperature": NaN, '
                         b'"previous_response_id": "PREVIOUS"}'),
    ("application/json", b'{"model": "fake-model", "input": "hi\\ud800", "previous_response_id": "PREVIOUS"}'),
    ("application/json", b'{"model": "fake-model", "input": "hi", "previous_response_id": "PREVIOUS", '
                         b'"previous_response_id": "OWN"}'),
    ("application/x-www-form-urlencoded",
     b'{"model": "fake-model", "input": "hi", "previous_response_id": "PREVIOUS"}'),
])
def test_bodies_the_proxy_cannot_read_strictly_are_refused(billed: Billed, path: str, content_type: str,
                                                           body: bytes) -> None:
    theirs = billed.client(billed.ann).responses.create(model=MODEL, input="Ann's private notes")
    own = billed.client(billed.bob).responses.create(model=MODEL, input="Bob's own")
    before = billed.reached()
    sent = body.replace(b"PREVIOUS", theirs.id.encode()).replace(b"OWN", own.id.encode())
    status, answer = billed.raw("POST", path, billed.bob, sent, content_type)
    assert status == 400 and answer["error"]["code"] in ("invalid_json", "invalid_content_type"), (status, answer)
    assert billed.reached() == before, "nothing the proxy could not parse was forwarded"


def test_what_goes_upstream_is_the_body_the_proxy_read(billed: Billed) -> None:
    sent = b'{ "model" : "fake-model",\n  "messages": [ {"role": "user", "content": "spaced \\u0041 out"} ] }'
    answered = httpx.post(billed.proxy.url + CHAT, headers={**billed.ann, "Content-Type": "application/json"},
                          content=sent)
    assert answered.status_code == 200
    forwarded = billed.upstream.log.for_path(CHAT)[-1]
    assert forwarded.body == read_body(sent)[1] == b'{"model":"fake-model","messages":[{"role":"user",' \
                                                   b'"content":"spaced A out"}]}'
    assert forwarded.headers["Content-Type"] == "application/json"


OVERRIDES = {"X-Original-URL": "/v1/embeddings", "X-Rewrite-URL": "/v1/embeddings",
             "X-HTTP-Method-Override": "DELETE", "X-Method-Override": "DELETE", "X-HTTP-Method": "DELETE",
             "X-Real-IP": "10.0.0.1", "X-Forwarded-Prefix": "/admin", "X-Forwarded-Host": "evil.example",
             "Forwarded": "host=evil.example", "X-Forwarded-For": "10.9.9.9", "Idempotency-Key": "shared-key",
             "OpenAI-Project": "proj_other", "X-Custom": "x"}


def test_override_and_forwarding_headers_never_reach_the_upstream(billed: Billed) -> None:
    ann, bob = billed.client(billed.ann), billed.client(billed.bob)
    theirs = ann.responses.create(model=MODEL, input="Ann's plan")
    own = bob.responses.create(model=MODEL, input="Bob's plan")
    for name, value in OVERRIDES.items():
        headers = {**billed.bob, name: value if value != "/v1/embeddings" else f"/v1/responses/{theirs.id}"}
        if name == "X-Original-URL":
            headers["X-HTTP-Method-Override"] = "DELETE"
        got = httpx.get(f"{billed.proxy.url}/v1/responses/{own.id}", headers=headers)
        assert got.status_code == 200 and got.json()["id"] == own.id, name
    chat = httpx.post(billed.proxy.url + CHAT, headers={**billed.ann, **OVERRIDES, "Host": "evil.example"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and "choices" in chat.json(), "answered as the chat completion it is"
    sent = {name.lower() for name in OVERRIDES} - {"x-forwarded-for"}
    for entry in billed.upstream.log.entries:
        assert not sent & {name.lower() for name in entry.headers}, (entry.path, dict(entry.headers))
        assert entry.headers.get("X-Forwarded-For") in (None, "127.0.0.1")
        assert "X-Forwarded-Host" not in entry.headers and "evil.example" not in entry.headers.get("Host", "")
    assert billed.upstream.reread == []
    assert ann.responses.retrieve(theirs.id).id == theirs.id, "Ann's response was neither read nor deleted"


def test_an_operator_may_forward_more_headers_but_never_an_override(lenient: LenientFakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(lenient.url, **{"cache.enabled": False, "data_dir": str(tmp_path),
                                              "upstreams.forward_headers": ["X-Custom", "OpenAI-Project"]})
    with ProxyServer(settings) as proxy:
        httpx.post(proxy.url + CHAT, headers={"X-Custom": "kept", "OpenAI-Project": "p", "X-Other": "dropped"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    seen = lenient.log.for_path(CHAT)[-1].headers
    assert (seen["X-Custom"], seen["OpenAI-Project"]) == ("kept", "p") and "X-Other" not in seen
    for refused in ("X-Original-URL", "X-HTTP-Method-Override", "X-Forwarded-Prefix", "Authorization", "Connection"):
        with pytest.raises(ValueError, match=refused):
            proxy_settings(lenient.url, **{"upstreams.forward_headers": [refused]})


def test_a_header_named_in_connection_neither_goes_upstream_nor_keys_the_cache(lenient: LenientFakeLLM,
                                                                              tmp_path: Path) -> None:
    settings = proxy_settings(lenient.url, **{"data_dir": str(tmp_path), "auth.mode": "keys"})
    body = {"model": MODEL, "temperature": 0, "messages": [{"role": "user", "content": "our policy?"}]}
    with ProxyServer(settings) as proxy:
        keys = proxy.runtime.credits.keys
        assert keys is not None
        ann, bob = ({"Authorization": f"Bearer {proxy.call(keys.create(user, 'acme')).plaintext}"}
                    for user in ("ann", "bob"))
        hop = httpx.post(proxy.url + CHAT, json=body, headers={**ann, "OpenAI-Beta": "feature=v2",
                                                               "Connection": "keep-alive, OpenAI-Beta"})
        assert hop.headers["X-Cache-Status"] == "MISS"
        assert "OpenAI-Beta" not in lenient.log.for_path(CHAT)[-1].headers, "hop-by-hop for that request"
        plain = httpx.post(proxy.url + CHAT, json=body, headers={**bob, "OpenAI-Beta": "feature=v2"})
        assert plain.headers["X-Cache-Status"] == "MISS", "not the answer made without the header"
        assert lenient.log.for_path(CHAT)[-1].headers["OpenAI-Beta"] == "feature=v2"
        again = httpx.post(proxy.url + CHAT, json=body, headers=ann)
        assert again.headers["X-Cache-Status"] == "HIT", "the first answer was keyed without the header"


def test_background_is_refused_where_it_would_be_billed_unfinished(billed: Billed) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        billed.client(billed.ann).responses.create(model=MODEL, input="Write a long essay", background=True)
    assert refused.value.param == "background" and refused.value.code == "unsupported_parameter"
    assert billed.reached() == [] and billed.charges("ann") == []


def test_items_are_referenced_only_by_their_owner(billed: Billed) -> None:
    ann, bob = billed.client(billed.ann), billed.client(billed.bob)
    first = ann.responses.create(model=MODEL, input="Ann's diary: the code is 4711")
    said = first.output[0].id
    assert said is not None
    listed = ann.responses.input_items.list(first.id).data[0].id
    with ann.responses.stream(model=MODEL, input="Ann streams") as stream:
        streamed = stream.get_final_response().output[0].id
    before = billed.reached()
    for body in ({"type": "item_reference", "id": said}, {"type": "reasoning", "id": said, "summary": []},
                 {"type": "item_reference", "id": "msg_" + "0" * 48}, {"type": "item_reference", "id": "../x"}):
        for create in (bob.responses.create, bob.responses.input_tokens.count, bob.responses.compact):
            with pytest.raises(openai.NotFoundError) as refused:
                create(model=MODEL, input=[body])  # type: ignore[operator]
            assert refused.value.body == {"message": f"Item with id '{body['id']}' not found.", "param": "input",
                                          "type": "invalid_request_error", "code": None}
    with pytest.raises(openai.NotFoundError):  # an input item's id may have been written by any client
        ann.responses.create(model=MODEL, input=[{"type": "item_reference", "id": listed}])
    assert billed.reached() == before, "no reference the proxy could not check was forwarded"
    for item, words in ((said, "4711"), (streamed, "streams")):
        again = ann.responses.create(model=MODEL, input=[{"type": "item_reference", "id": item},
                                                         {"role": "user", "content": "and?"}])
        read = [turn["text"] for turn in billed.upstream.stored[again.id].turns]
        assert any(words in text for text in read), ("the owner's reference was read upstream", read)


@pytest.mark.parametrize(("extra", "param"), [
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "input"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools"),
    ({"tools": [{"type": "code_interpreter", "container": "cntr_1"}]}, "tools"),
])
def test_objects_no_tenant_made_through_the_proxy_are_refused(billed: Billed, extra: dict[str, Any],
                                                              param: str) -> None:
    body = {"model": MODEL, "input": "hi", **extra}
    for path in ("/v1/responses", "/v1/responses/input_tokens", "/v1/responses/compact"):
        refused = httpx.post(billed.proxy.url + path, headers=billed.ann, json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, (path, refused.text)
    assert billed.reached() == []


def test_a_chat_message_naming_a_stored_file_is_refused(billed: Billed) -> None:
    content = [{"type": "text", "text": "summarise"}, {"type": "file", "file": {"file_id": "file-of-someone"}}]
    refused = httpx.post(billed.proxy.url + CHAT, headers=billed.ann,
                         json={"model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_parameter"
    assert billed.reached() == []
