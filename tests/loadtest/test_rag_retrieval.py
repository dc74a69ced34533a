"""The fidelity bench's RAG loop: corpus outside the traffic, searches through the proxy's Qdrant route, the two
ways documents are sent, and the upstream double's citations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from loadtest.bench.fidelity import ClusterAnswerUpstream, RagLoop
from loadtest.rag_retrieval import Retriever, asked, corpus, first_source, first_words, inline_message, load
from normalizer.documents import Document, render_system
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


def test_corpus_never_holds_a_traffic_question(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("question1,question2,is_duplicate\nA?,B?,1\nC?,A?,0\nD?,E?,0\n", encoding="utf-8")
    assert corpus(path, {"A?", "E?"}, 10) == ["B?", "C?", "D?"]
    assert corpus(path, {"A?"}, 2) == ["B?", "C?"]


def test_searches_go_through_the_proxy_and_come_back_best_first(fake_llm_thread: FakeLLM,
                                                                 qdrant_shim: QdrantShim) -> None:
    vectors = {"near": np.array([1.0, 0.1]), "far": np.array([0.0, 1.0]), "mid": np.array([1.0, 1.0]),
               "q": np.array([2.0, 0.0])}
    settings = proxy_settings(fake_llm_thread.url, **{"upstreams.qdrant.url": qdrant_shim.url})
    with ProxyServer(settings) as server:
        async def run() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
            async with aiohttp.ClientSession() as session:
                await load(session, qdrant_shim.url, ["far", "near", "mid"], vectors)
                retriever = Retriever(server.url, 2, vectors)
                first = await retriever.top_k(session, "q")
                again = await retriever.top_k(session, "q")
                assert (retriever.searches, retriever.cached) == (2, 1), "the repeat came from the search cache"
                return first, again

        first, again = asyncio.run(run())
    assert first == again == [{"id": "doc-1", "text": "near"}, {"id": "doc-2", "text": "mid"}]
    assert len(qdrant_shim.log.for_path("/collections/rag-corpus/points/search")) == 1


def test_the_upstream_cites_the_first_document_it_was_given() -> None:
    documents = [Document(id="doc-7", text="seven"), Document(id="doc-3", text="three")]

    async def ask(system: str | None, user: str = "q?") -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        async with TestClient(TestServer(ClusterAnswerUpstream({"q?": 4}).app())) as client:
            response = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
            return str((await response.json())["choices"][0]["message"]["content"])

    structured = asyncio.run(ask(render_system("Answer.", documents)))
    assert structured.endswith(" [doc-7]") and structured.startswith("Answer 4:")
    inline = asyncio.run(ask("Answer.", inline_message("q?", [{"id": "doc-3", "text": "three"}])))
    assert inline.endswith(" [1]") and inline.startswith("Answer 4:"), "the question read out of the sources"
    assert first_source("Answer.", "q?") is None
    assert asked("q?") == "q?"


@pytest.mark.parametrize(("cite", "structured", "inline"), [
    ("auto", "[doc-7]", "[1]"), ("position", "[1]", "[1]"), ("id", "[doc-7]", None),
    ("source-id", "[source: doc-7]", None), ("title", '(from "Seven things")', None), ("none", None, None)])
def test_the_upstream_cites_in_the_form_asked(cite: str, structured: str | None, inline: str | None) -> None:
    system = render_system("Answer.", [Document("doc-7", "seven words here", "Seven things"), Document("doc-3", "x")])
    assert first_source(system, "q?", cite) == structured
    if inline is not None:
        assert first_source("Answer.", inline_message("q?", [{"id": "doc-3", "text": "three"}]), cite) == inline
    assert first_words(system, "q?", 2) == "seven words"
    assert first_words("Answer.", inline_message("q?", [{"id": "d", "text": "three words here"}]), 2) == "three words"


def test_a_hit_is_miscited_where_it_names_a_document_the_new_request_lacks() -> None:
    d1, d2, d3 = ({"id": f"doc-{i}", "text": str(i)} for i in range(1, 4))
    cases = [("structured", "answer [doc-1]", [d2, d1], 0), ("structured", "answer [doc-1]", [d2, d3], 1),
             ("structured", "answer [source: doc-1]", [d2, d3], 1),
             ("structured", 'answer (from "Knowledge base entry 1")', [d2, d3], 1),
             ("structured", 'answer (from "Knowledge base entry 1")', [d1], 0),
             # positions are not judged: the model numbered the documents in the order the proxy sent them
             ("inline", "answer [1]", [d2, d1], 0), ("inline", "answer [2]", [d2, d1], 0),
             # served without its citation (the new request lacks the document), or citing nothing: no citation is
             # wrong
             ("structured", "answer", [d2, d3], 0), ("inline", "answer", [d2, d3], 0)]
    for form, served, served_with, miscited in cases:
        rag = RagLoop(Retriever("http://unused", 2, {}), form)
        rag.judge(served, "SEMANTIC_HIT", [d1, d2], served_with)
        assert rag.miscited == miscited, (form, served, served_with)
        assert (rag.identical_documents, rag.same_document_set) == (0, served_with == [d2, d1])
