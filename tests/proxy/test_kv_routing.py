"""Documents, order, hints and routing through HTTP, against fake replicas that model a prefix KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from normalizer.repeated_blocks import ENTRY_BYTES
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

CHAT = "/v1/chat/completions"
DOCS = [{"id": f"d{i}", "text": f"Passage {i}: " + " ".join(f"word{i}_{j}" for j in range(120))} for i in range(4)]


@pytest.fixture
def replicas() -> Iterator[list[FakeLLM]]:
    with FakeLLM(kv=KVCacheModel(capacity_blocks=4096)) as a, FakeLLM(kv=KVCacheModel(capacity_blocks=4096)) as b:
        yield [a, b]


def _settings(replicas: list[FakeLLM], kind: str = "openai", **overrides: Any) -> Any:
    return proxy_settings(**{"upstreams.llm": [{"url": r.url, "kind": kind} for r in replicas],
                             "cache.enabled": False, "routing.expose_headers": True, **overrides})


def _structured(docs: list[dict[str, str]], question: str) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "system", "content": "Answer from the documents."},
                                                {"role": "user", "content": question}],
            "ragproxy": {"documents": docs}}


def _cached(response: httpx.Response) -> int:
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_structured_documents_are_rendered_byte_stably(replicas: list[FakeLLM]) -> None:
    with ProxyServer(_settings(replicas)) as server:
        response = httpx.post(server.url + CHAT, json=_structured(DOCS[:2], "What is in passage 1?"))
    assert response.status_code == 200
    sent = next(r for r in replicas if r.log.count(CHAT)).log.for_path(CHAT)[-1].json()
    assert "ragproxy" not in sent
    system = sent["messages"][0]["content"]
    assert system.count("<document") == 2 and DOCS[0]["text"] in system


def test_same_documents_stick_to_one_replica_and_reuse_its_kv(replicas: list[FakeLLM]) -> None:
    with ProxyServer(_settings(replicas, **{"routing.order": "reuse"})) as server:
        answers = [httpx.post(server.url + CHAT, json=_structured(order, question)) for order, question in [
            (DOCS[:3], "first question"), ([DOCS[2], DOCS[0], DOCS[1]], "second question"),
            ([DOCS[1], DOCS[2], DOCS[0]], "third question")]]
    assert {a.headers["X-RagProxy-Replica"] for a in answers} == {answers[0].headers["X-RagProxy-Replica"]}
    # [d2, d0, d1] follows the cached path d0, d1 with the top-ranked d2 moved to the far edge: all three reused;
    # [d1, d2, d0] keeps d1 at an edge, so at least d0 is reused
    assert _cached(answers[1]) > 300 and _cached(answers[2]) > 100


def test_preserve_keeps_the_retrieval_order(replicas: list[FakeLLM]) -> None:
    with ProxyServer(_settings(replicas, **{"routing.order": "preserve"})) as server:
        httpx.post(server.url + CHAT, json=_structured([DOCS[2], DOCS[0]], "q"))
    sent = next(r for r in replicas if r.log.count(CHAT)).log.for_path(CHAT)[-1].json()["messages"][0]["content"]
    assert sent.index(DOCS[2]["text"]) < sent.index(DOCS[0]["text"])


def test_documents_from_searches_are_detected_in_prompts(replicas: list[FakeLLM], qdrant_shim: QdrantShim) -> None:
    settings = _settings(replicas, **{"upstreams.qdrant.url": qdrant_shim.url, "routing.order": "reuse"})
    with ProxyServer(settings) as server:
        httpx.put(server.url + "/collections/kb", json={"vectors": {"size": 2, "distance": "Cosine"}})
        httpx.put(server.url + "/collections/kb/points?wait=true", json={"points": [
            {"id": i, "vector": [1.0, i / 10], "payload": {"text": d["text"]}} for i, d in enumerate(DOCS)]})
        found = httpx.post(server.url + "/collections/kb/points/query",
                           json={"query": [1.0, 0.1], "limit": 4, "with_payload": True})
        assert found.status_code == 200
        assert len(server.runtime.documents) == 4  # type: ignore[arg-type]
        for order in ([0, 1, 2], [2, 1, 0]):
            context = "\n\n".join(DOCS[i]["text"] for i in order)
            httpx.post(server.url + CHAT, json={"model": "fake-model", "messages": [
                {"role": "user", "content": f"Context:\n{context}\n\nQuestion: which passage?"}]})
    prompts = [r.json()["messages"][0]["content"] for replica in replicas for r in replica.log.for_path(CHAT)]
    hint = "\nRelevance order of the passages above, most relevant first: 3, 2, 1."  # the second's retrieval order
    assert len(prompts) == 2, "detected documents are put in one stable order, the retrieval rank after them"
    assert prompts[1] == prompts[0].replace("\n\nQuestion:", hint + "\n\nQuestion:")


def test_pasted_numbered_passages_are_recognised_without_a_search(replicas: list[FakeLLM]) -> None:
    """No search through the proxy: the passages are recognised by their numbered shape, reordered whole (their
    labels staying in place) onto the path the replica has cached, and routed to it."""
    with ProxyServer(_settings(replicas, **{"routing.order": "reuse"})) as server:
        answers = []
        for order, question in (([0, 1, 2], "first"), ([2, 0, 1], "second")):
            passages = "\n".join(f"[{n}] {DOCS[i]['text']}" for n, i in enumerate(order, 1))
            answers.append(httpx.post(server.url + CHAT, json={"model": "fake-model", "messages": [
                {"role": "system", "content": "Answer from the numbered passages."},
                {"role": "user", "content": f"{passages}\n\nQuestion: {question} passage?"}]}))
    assert {a.status_code for a in answers} == {200}
    assert answers[0].headers["X-RagProxy-Replica"] == answers[1].headers["X-RagProxy-Replica"]
    sent = [r.json()["messages"][1]["content"] for replica in replicas for r in replica.log.for_path(CHAT)]
    hint = "\nRelevance order of the passages above, most relevant first: 3, 1, 2."  # the best now third
    assert sent[1].rpartition("\n\n")[0] == sent[0].rpartition("\n\n")[0] + hint
    assert _cached(answers[1]) > 300


def test_blank_line_joined_chunks_are_recognised_once_they_moved_between_requests(replicas: list[FakeLLM]) -> None:
    """No search, no shape: chunks joined by blank lines count as documents once they met other neighbours in
    earlier requests; from then on they are reordered whole onto the path the replica has cached, and routed to it.
    The app's own paragraphs stay where they are."""
    header = "Use the following pieces of context to answer the question at the end."
    with ProxyServer(_settings(replicas, **{"routing.order": "reuse"})) as server:
        answers = []
        for order, question in (([0, 1, 2], "first"), ([2, 0, 1], "second"), ([1, 2, 0], "third"),
                                ([0, 1, 2], "fourth")):
            context = "\n\n".join(DOCS[i]["text"] for i in order)
            answers.append(httpx.post(server.url + CHAT, json={"model": "fake-model", "messages": [
                {"role": "user", "content": f"{header}\n\n{context}\n\nQuestion: which is the {question} passage?"}]}))
        assert len(server.runtime.documents) == 3  # type: ignore[arg-type]
        ledger = {line.name: line for line in server.runtime.ledger.accounts()}
    seen = ledger["repeated_blocks"]  # the header and the 3 chunks (a question of 6 words is too short to keep)
    assert (seen.entries, seen.bytes, seen.setting) == (4, 4 * ENTRY_BYTES, "routing.repeated_blocks_max_bytes")
    assert {a.status_code for a in answers} == {200}
    prompts = [r.json()["messages"][0]["content"] for replica in replicas for r in replica.log.for_path(CHAT)]
    sent = [next(p for p in prompts if f"the {q} passage" in p) for q in ("first", "second", "third", "fourth")]
    assert len(prompts) == 4 and "Relevance order" not in "".join(sent[:3]), "sent as written until recognised"
    hint = "\nRelevance order of the passages above, most relevant first: 3, 1, 2."  # [0, 1, 2] on the path [1, 2, 0]
    assert sent[3] == sent[2].replace("third", "fourth").replace("\n\nQuestion:", hint + "\n\nQuestion:")
    assert answers[3].headers["X-RagProxy-Replica"] == answers[2].headers["X-RagProxy-Replica"]
    assert _cached(answers[3]) > 300


def test_slo_that_cannot_be_met_is_429(replicas: list[FakeLLM]) -> None:
    with ProxyServer(_settings(replicas, **{"routing.ttft_slo_s": 1e-9})) as server:
        response = httpx.post(server.url + CHAT, json=_structured(DOCS, "q"))
    assert response.status_code == 429
    assert response.headers["Retry-After"]
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert sum(r.log.count(CHAT) for r in replicas) == 0


@pytest.mark.parametrize(("kind", "field"), [("llamacpp", "cache_prompt"), ("vllm", "cache_salt")])
def test_backend_hints(replicas: list[FakeLLM], kind: str, field: str) -> None:
    with ProxyServer(_settings(replicas, kind=kind)) as server:
        for question in ("q", "another q"):  # the second shares the first's prefix
            assert httpx.post(server.url + CHAT, json=_structured(DOCS[:2], question)).status_code == 200
    first, sent = next(r for r in replicas if r.log.count(CHAT) == 2).log.for_path(CHAT)
    assert field in sent.json()
    if kind == "llamacpp":  # an empty slot is left to the server; the one holding the first prompt is pinned
        assert sent.json()["cache_prompt"] is True
        assert "id_slot" not in first.json() and isinstance(sent.json()["id_slot"], int)
    assert sent.headers["X-Prefix-Docs"] == "d0,d1"


def test_shift_order_asks_llamacpp_to_reuse_chunks_outside_the_prefix(replicas: list[FakeLLM]) -> None:
    settings = _settings(replicas, kind="llamacpp", **{"routing.order": "shift", "routing.shift_min_tokens": 48})
    with ProxyServer(settings) as server:
        assert httpx.post(server.url + CHAT, json=_structured(DOCS[:2], "q")).status_code == 200
    (sent,) = [entry for r in replicas for entry in r.log.for_path(CHAT)]
    assert sent.json()["n_cache_reuse"] == 48 and sent.json()["cache_prompt"] is True


def test_routing_headers_are_hidden_by_default_and_salts_follow_private_scopes(replicas: list[FakeLLM]) -> None:
    """The tree is shared by tenants, so its estimate stays internal unless configured; ``cache_salt`` separates
    users in a private namespace and not in an ordinary one."""
    one = replicas[:1]
    settings = _settings(one, "vllm", **{"routing.expose_headers": False, "auth.mode": "keys",
                                         "cache.enabled": True, "cache.private_namespaces": ["mine"]})
    salts: dict[tuple[str, str], str] = {}
    with ProxyServer(settings) as server:
        keys = server.runtime.credits.keys
        assert keys is not None
        for user in ("alice", "bob"):
            secret = str(server.call(keys.create(user, "acme")).plaintext)
            for namespace in ("mine", "team"):
                question = f"what does {user} see in {namespace}?"  # a miss each time: the request reaches the backend
                response = httpx.post(server.url + CHAT, json=_structured(DOCS[:2], question), headers={
                    "Authorization": f"Bearer {secret}", "X-Ragproxy-Namespace": namespace})
                assert response.status_code == 200, response.text
                assert "X-RagProxy-Replica" not in response.headers
                assert "X-RagProxy-Cached-Tokens-Estimate" not in response.headers
                salts[(user, namespace)] = one[0].log.for_path(CHAT)[-1].json()["cache_salt"]
    assert salts[("alice", "team")] == salts[("bob", "team")]
    assert salts[("alice", "mine")] != salts[("bob", "mine")]
    assert salts[("alice", "mine")] != salts[("alice", "team")]
