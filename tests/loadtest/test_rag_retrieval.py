"""The fidelity bench's RAG-loop retrieval: corpus outside the traffic, best-first order, citations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from loadtest.bench.fidelity import ClusterAnswerUpstream
from loadtest.rag_retrieval import cited, corpus, first_document, top_k
from normalizer.documents import Document, render_system


def test_corpus_never_holds_a_traffic_question(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("question1,question2,is_duplicate\nA?,B?,1\nC?,A?,0\nD?,E?,0\n", encoding="utf-8")
    assert corpus(path, {"A?", "E?"}, 10) == ["B?", "C?", "D?"]
    assert corpus(path, {"A?"}, 2) == ["B?", "C?"]


def test_top_k_is_best_first_by_cosine() -> None:
    vectors = {"near": np.array([1.0, 0.1]), "far": np.array([0.0, 1.0]), "mid": np.array([1.0, 1.0])}
    found = top_k({"q": np.array([2.0, 0.0])}, ["far", "near", "mid"], vectors, 2)
    assert found["q"] == [{"id": "doc-1", "text": "near"}, {"id": "doc-2", "text": "mid"}]


def test_the_upstream_cites_the_first_document_it_was_given() -> None:
    documents = [Document(id="doc-7", text="seven"), Document(id="doc-3", text="three")]

    async def ask(system: str | None) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "q?"}]
        async with TestClient(TestServer(ClusterAnswerUpstream({"q?": 4}).app())) as client:
            response = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
            return str((await response.json())["choices"][0]["message"]["content"])

    assert cited(asyncio.run(ask(render_system("Answer.", documents)))) == "doc-7"
    assert cited(asyncio.run(ask("Answer."))) is None
    assert first_document(render_system("", documents[1:])) == "doc-3"
