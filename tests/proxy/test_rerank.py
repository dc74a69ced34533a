"""Rerankers through the proxy, against doubles of the real servers: the same answers as directly, in each server's
own shape, with a repeated query over an overlapping candidate set forwarding only the documents not scored yet."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from loadtest.bench._surfaces import HealthProbe
from proxy.core.outcome import MICRO
from proxy.credits.store import CreditStore, LedgerEntry, ledger_entries
from tests.support.objects import without
from tests.support.proxy_server import ProxyProcess, ProxyServer, proxy_settings
from upstream_doubles.rerankers import FakeReranker

QUERY = "how tall is the eiffel tower"
DOCS = ["The Eiffel Tower is 330 metres tall.", "Paris is the capital of France.",
        "The tower was built for the 1889 fair.", "Bananas are rich in potassium."]
MORE = [DOCS[2], "Gustave Eiffel's company built the tower.", DOCS[0]]
VOLATILE = {"id", "created", "usage"}


def _stable(obj: Any) -> Any:
    return without(obj, VOLATILE)


def _served(flavor: str, **overrides: Any) -> Iterator[tuple[FakeReranker, ProxyServer]]:
    with FakeReranker(flavor) as fake, ProxyServer(proxy_settings(fake.url, **overrides)) as proxy:
        yield fake, proxy


@pytest.fixture(params=["vllm", "jina", "cohere"])
def rerank_server(request: pytest.FixtureRequest) -> Iterator[tuple[FakeReranker, ProxyServer, str]]:
    path = {"vllm": "/v1/rerank", "jina": "/v1/rerank", "cohere": "/v2/rerank"}[request.param]
    for fake, proxy in _served(request.param):
        yield fake, proxy, path


def _post(url: str, body: Any) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30)


async def _charges(store: CreditStore, user: str) -> list[LedgerEntry]:
    return [e async for e in ledger_entries(store) if e.user == user and e.kind == "charge"]


def _sent_documents(fake: FakeReranker, path: str) -> list[Any]:
    body = fake.log.for_path(path)[-1].json()
    assert "top_n" not in body, "every document sent is scored: top_n is applied after merging"
    return list(body.get("documents") or body.get("texts") or body.get("text_2"))


def test_rerank_shapes_round_trip_and_forward_only_new_documents(
        rerank_server: tuple[FakeReranker, ProxyServer, str]) -> None:
    fake, proxy, path = rerank_server
    body = {"model": "fake-reranker", "query": QUERY, "documents": DOCS, "top_n": 3}
    direct = _post(fake.url + path, body).json()
    miss = _post(proxy.url + path, body)
    assert miss.headers["X-Cache-Status"] == "MISS" and miss.headers["X-Cache-Hits"] == "0/4"
    assert _stable(miss.json()) == _stable(direct)
    assert len(miss.json()["results"]) == 3 and miss.json()["results"][0]["index"] == 0
    hit = _post(proxy.url + path, body)
    assert hit.headers["X-Cache-Status"] == "HIT" and hit.headers["X-Cache-Hits"] == "4/4"
    assert hit.json()["results"] == miss.json()["results"]
    calls = len(fake.log.for_path(path))
    overlapping = {"model": "fake-reranker", "query": QUERY, "documents": MORE}
    partial = _post(proxy.url + path, overlapping)
    assert partial.headers["X-Cache-Status"] == "MISS" and partial.headers["X-Cache-Hits"] == "2/3"
    assert _sent_documents(fake, path) == [MORE[1]], "only the document not scored before"
    assert len(fake.log.for_path(path)) == calls + 1
    assert _stable(partial.json()) == _stable(_post(fake.url + path, overlapping).json())


def test_vllm_usage_counts_every_document_and_objects_equal_strings() -> None:
    for fake, proxy in _served("vllm"):
        body = {"model": "fake-reranker", "query": QUERY, "documents": DOCS}
        first = _post(proxy.url + "/rerank", body).json()
        as_objects = {**body, "documents": [{"text": d} for d in DOCS]}
        again = _post(proxy.url + "/v1/rerank", as_objects)
        assert again.headers["X-Cache-Status"] == "HIT"
        assert again.json()["usage"] == first["usage"] == _post(fake.url + "/rerank", body).json()["usage"]
        partial = _post(proxy.url + "/v2/rerank", {**body, "documents": MORE}).json()["usage"]
        direct = _post(fake.url + "/v2/rerank", {**body, "documents": MORE}).json()["usage"]
        assert abs(partial["total_tokens"] - direct["total_tokens"]) <= 3, "cached pairs: their share, by length"


def test_jina_documents_are_kept_apart_from_answers_without_them() -> None:
    for fake, proxy in _served("jina"):
        body = {"model": "fake-reranker", "query": QUERY, "documents": DOCS}
        shown = _post(proxy.url + "/v1/rerank", body).json()
        assert all("document" in result for result in shown["results"])
        hidden = _post(proxy.url + "/v1/rerank", {**body, "return_documents": False})
        assert hidden.headers["X-Cache-Status"] == "MISS", "return_documents is keyed: the stored results differ"
        assert _stable(hidden.json()) == _stable(_post(fake.url + "/v1/rerank",
                                                       {**body, "return_documents": False}).json())


def test_tei_list_shape_raw_scores_and_texts() -> None:
    for fake, proxy in _served("tei"):
        for options in ({}, {"raw_scores": True}, {"return_text": True}):
            body = {"query": QUERY, "texts": DOCS, **options}
            direct = _post(fake.url + "/rerank", body).json()
            assert _post(proxy.url + "/rerank", body).json() == direct
            hit = _post(proxy.url + "/rerank", body)
            assert hit.headers["X-Cache-Status"] == "HIT" and hit.json() == direct
        partial = _post(proxy.url + "/rerank", {"query": QUERY, "texts": MORE})
        assert partial.headers["X-Cache-Hits"] == "2/3" and _sent_documents(fake, "/rerank") == [MORE[1]]
        assert partial.json() == _post(fake.url + "/rerank", {"query": QUERY, "texts": MORE}).json()
        error = _post(proxy.url + "/rerank", {"query": QUERY, "texts": []})
        assert error.status_code == 422 and error.headers["X-Cache-Status"] == "BYPASS", "the server's own error"


def test_vllm_score_pairs_in_request_order() -> None:
    for fake, proxy in _served("vllm"):
        body = {"model": "fake-reranker", "text_1": QUERY, "text_2": DOCS}
        direct = _post(fake.url + "/v1/score", body).json()
        assert _stable(_post(proxy.url + "/v1/score", body).json()) == _stable(direct)
        assert [d["index"] for d in direct["data"]] == [0, 1, 2, 3]
        pairs = {"model": "fake-reranker", "text_1": [QUERY, "fruit"], "text_2": [DOCS[0], DOCS[3]]}
        answer = _post(proxy.url + "/score", pairs)
        assert answer.headers["X-Cache-Hits"] == "1/2", "the first pair was scored above, under the same query"
        assert fake.log.for_path("/score")[-1].json()["text_1"] == ["fruit"]
        assert _stable(answer.json()) == _stable(_post(fake.url + "/score", pairs).json())


def test_unknown_fields_bypass_with_a_reason_and_shapes_left_to_the_upstream_are_forwarded() -> None:
    for fake, proxy in _served("vllm"):
        unknown = _post(proxy.url + "/v1/rerank", {"query": QUERY, "documents": DOCS, "novel": 1})
        assert unknown.headers["X-Cache-Status"] == "BYPASS"
        assert unknown.headers["X-Cache-Bypass-Reason"] == "unknown field(s): novel"
        empty = _post(proxy.url + "/v1/rerank", {"query": QUERY, "documents": []})
        assert empty.headers["X-Cache-Status"] == "BYPASS" and fake.log.for_path("/v1/rerank")[-1].json()[
            "documents"] == [], "an empty list is the upstream's to judge"
        not_json = httpx.post(proxy.url + "/rerank", content=b"{", headers={"Content-Type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"


MALFORMED = [("/v1/rerank", {"query": QUERY, "documents": [1, 2]}), ("/v2/rerank", {"query": QUERY, "documents": "a"}),
             ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": "x"}),
             ("/v1/score", {"text_1": QUERY, "text_2": [1.5]})]


@pytest.mark.parametrize("cache", [True, False])
def test_wrong_types_are_refused_with_a_400_and_never_forwarded(cache: bool) -> None:
    """They used to be forwarded (the cache bypassed them as not canonicalizable) and the upstream's 500 relayed."""
    for fake, proxy in _served("vllm", **{"cache.enabled": cache}):
        for path, body in MALFORMED:
            answer = _post(proxy.url + path, body)
            assert answer.status_code == 400, (path, body, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "invalid_type" and error["type"] == "invalid_request_error"
        assert not [entry for entry in fake.log.entries if entry.method == "POST"]


def test_documents_beyond_the_limit_are_refused_with_a_413() -> None:
    for fake, proxy in _served("vllm", **{"limits.rerank_documents": 3}):
        assert _post(proxy.url + "/v1/rerank", {"query": QUERY, "documents": DOCS[:3]}).status_code == 200
        refused = _post(proxy.url + "/v1/rerank", {"query": QUERY, "documents": DOCS})
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "too_many_documents"
        assert "at most 3" in refused.json()["error"]["message"]
        scores = _post(proxy.url + "/v1/score", {"text_1": QUERY, "text_2": DOCS})
        assert scores.status_code == 413 and len(fake.log.for_path("/v1/rerank")) == 1


def test_reranking_is_billed_per_document_with_cached_ones_at_the_hit_price(tmp_path: Path) -> None:
    for _fake, proxy in _served("vllm", **{"auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path),
                                           "credits.sqlite_synchronous": "NORMAL", "credits.rerank_price": "0.01"}):
        keys, store = proxy.runtime.credits.keys, proxy.runtime.credits.store
        assert keys is not None and store is not None
        key = proxy.call(keys.create("rita", "acme")).plaintext
        proxy.call(store.top_up("rita", 1 * MICRO, tenant="acme"))
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "fake-reranker", "query": QUERY, "documents": DOCS}
        miss = httpx.post(proxy.url + "/v1/rerank", json=body, headers=headers, timeout=30)
        assert miss.headers["X-Credits-Charged"] == "0.04", "4 documents scored"
        partial = httpx.post(proxy.url + "/v1/rerank", json={**body, "documents": MORE}, headers=headers, timeout=30)
        assert partial.headers["X-Credits-Charged"] == "0.012", "1 scored + 2 cached at a tenth"

        entries = proxy.call(_charges(store, "rita"))
        assert [e.usage_source for e in entries] == ["documents", "documents"]
        assert [e.tier for e in entries] == ["upstream", "l1"]


def test_a_request_of_more_documents_than_cached_one_by_one_goes_through_as_it_is() -> None:
    """Beyond ``cache.rerank_max_documents`` the body goes upstream unchanged and the answer comes back unchanged,
    every time, marked BYPASS with the reason; requests within it are still cached document by document."""
    for fake, proxy in _served("vllm", **{"cache.rerank_max_documents": 3}):
        body = {"model": "fake-reranker", "query": QUERY, "documents": DOCS, "top_n": 2}
        answers = [_post(proxy.url + "/v1/rerank", body) for _ in range(2)]
        assert [a.headers["X-Cache-Status"] for a in answers] == ["BYPASS", "BYPASS"]
        assert answers[0].headers["X-Cache-Bypass-Reason"] == "4 documents: more than 3 are not cached one by one"
        sent = fake.log.for_path("/v1/rerank")
        assert [entry.json() for entry in sent] == [body, body], "forwarded as sent, top_n included, each time"
        assert _stable(answers[0].json()) == _stable(answers[1].json()) and len(answers[0].json()["results"]) == 2
        within = [_post(proxy.url + "/v1/rerank", {**body, "documents": DOCS[:3]}) for _ in range(2)]
        assert [a.headers["X-Cache-Status"] for a in within] == ["MISS", "HIT"]


def test_outsized_reranks_do_not_stall_other_requests() -> None:
    """A rerank of 10,000 documents (the default limit) and one of 100,000 (the limit raised), with the cache on,
    through a ``ragproxy serve`` process, while another process probes ``/healthz`` every 5 ms: hardly a probe due
    during the 100,000 waits more than 50 ms. Both are beyond ``cache.rerank_max_documents``, so they go upstream
    and back uncached. They used to be cached document by document, and parsing the reranker's answer, encoding
    the reply and the garbage collector's walks over the new entries held the event loop: on the project's 2-core
    machine 20-34% of the probes waited more than 50 ms (p99 260-630 ms), against 1-4% since (p99 13-70 ms, the
    request body's parsing and the machine's other load). The share may exceed the one in the 2 s before the reranks
    by 10 points at most: a machine loaded by other work makes probes late in both."""
    bodies = [orjson.dumps({"model": "fake-reranker", "query": QUERY,
                            "documents": [f"passage {n} {salt} about the tower" for n in range(count)]})
              for salt, count in [("a", 10_000), ("b", 100_000)]]
    with FakeReranker("vllm") as fake, ProxyProcess({"RAGPROXY_UPSTREAMS__LLM": f'[{{"url": "{fake.url}"}}]',
                                                     "RAGPROXY_LIMITS__RERANK_DOCUMENTS": "100000"}) as proxy:
        probe = HealthProbe(proxy.url)
        probe.start()
        with httpx.Client(base_url=proxy.url, timeout=60, headers={"Content-Type": "application/json"}) as client:
            assert client.get("/healthz").status_code == 200
            quiet = (time.monotonic(), time.monotonic() + 2.0)  # the machine's own lateness, measured in this run
            time.sleep(2.0)
            answers, spans = [], []
            for body in bodies:
                started = time.monotonic()
                answers.append(client.post("/v1/rerank", content=body))
                spans.append((started, time.monotonic()))
        samples = probe.samples()
    assert [(a.status_code, a.headers["X-Cache-Status"]) for a in answers] == [(200, "BYPASS")] * 2
    assert len(answers[1].json()["results"]) == 100_000
    during = np.asarray([waited for due, waited, _ in samples if spans[1][0] <= due < spans[1][1]])
    before = np.asarray([waited for due, waited, _ in samples if quiet[0] <= due < quiet[1]])
    assert all(answered for _, _, answered in samples) and len(during) > 50 and len(before) > 50
    assert float(np.mean(during > 0.05)) < float(np.mean(before > 0.05)) + 0.1, sorted(during)[-20:]
