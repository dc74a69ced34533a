"""Documents in prompts: structured rendering and detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normalizer.documents import (
    Document,
    DocumentRegistry,
    content_id,
    extract_structured,
    payload_texts,
    render,
    render_document,
    reorder_spans,
)

WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
DOC_TEXT = st.lists(WORDS, min_size=6, max_size=40).map(" ".join)


def _doc(n: int, words: int = 30) -> str:
    return " ".join(f"w{n}x{i}" for i in range(words))


@given(st.lists(DOC_TEXT, min_size=1, max_size=5, unique=True), st.randoms())
def test_a_document_renders_to_the_same_bytes_in_any_position(texts: list[str], rnd) -> None:
    docs = [Document.of(t) for t in texts]
    shuffled = list(docs)
    rnd.shuffle(shuffled)
    system = render("Answer from the documents.", shuffled, "why?")[0]["content"]
    for doc in docs:
        assert render_document(doc) in system
    assert render("S", docs, "q") == render("S", list(docs), "q")


def test_render_puts_documents_in_the_system_message_and_the_question_last() -> None:
    messages = render("Sys", [Document("a", "alpha text", "T")], "Q?")
    assert messages[0]["role"] == "system"
    assert messages[0]["content"] == 'Sys\n\n<document id="a" title="T">\nalpha text\n</document>\n'
    assert messages[1] == {"role": "user", "content": "Q?"}


def test_structured_body_field_and_document_parts_are_extracted_in_order() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "document", "text": "second doc text", "id": "d2"},
                    {"type": "text", "text": "What is up?"},
                ],
            },
        ],
    }
    prompt = extract_structured(body, [{"id": "d1", "text": "first doc text", "title": "One"}])
    assert prompt is not None
    assert [d.id for d in prompt.documents] == ["d1", "d2"]
    assert prompt.system == "Be brief."
    assert prompt.messages == ({"role": "user", "content": "What is up?"},)
    rendered = prompt.render_messages()
    assert rendered[0]["content"].startswith('Be brief.\n\n<document id="d1" title="One">')
    assert rendered[1]["content"] == "What is up?"


def test_structured_document_without_id_gets_its_content_hash() -> None:
    body = {"messages": [{"role": "user", "content": "q"}]}
    prompt = extract_structured(body, [{"text": "abc"}])
    assert prompt is not None and prompt.documents[0].id == content_id("abc")


def test_malformed_structured_document_is_an_error_and_plain_bodies_are_none() -> None:
    with pytest.raises(ValueError):
        extract_structured({"messages": []}, [{"title": "no text"}])
    with pytest.raises(ValueError):
        extract_structured({"messages": []}, {"id": "not a list"})
    assert extract_structured({"messages": [{"role": "user", "content": "hi"}]}) is None


def test_registry_detects_documents_in_order_of_appearance_despite_rewrapping() -> None:
    registry = DocumentRegistry(capacity=10)
    ids = [registry.add(_doc(n)) for n in range(4)]
    rewrapped = _doc(2).replace(" ", "\n", 5)
    prompt = f"Context:\n[1] {_doc(3)}\n\n[2] {rewrapped}\n\nQuestion: {_doc(9, 5)}"
    assert registry.detect(prompt) == [ids[3], ids[2]]


def test_registry_needs_the_whole_document_not_just_its_start() -> None:
    registry = DocumentRegistry()
    registry.add(_doc(1))
    truncated = " ".join(_doc(1).split()[:20])
    assert registry.detect(f"Context: {truncated} end") == []


def test_registry_is_a_bounded_lru() -> None:
    registry = DocumentRegistry(capacity=2)
    a, b = registry.add(_doc(1)), registry.add(_doc(2))
    registry.detect(_doc(1))  # touches a
    c = registry.add(_doc(3))
    assert len(registry) == 2
    assert a in registry and c in registry and b not in registry
    assert registry.detect(_doc(2)) == []


def test_registry_prefers_the_longest_document_sharing_an_anchor() -> None:
    registry = DocumentRegistry()
    short = registry.add(_doc(1, 10))
    long = registry.add(_doc(1, 30))
    assert registry.detect("x " + _doc(1, 30) + " y") == [long]
    assert registry.detect("x " + _doc(1, 12) + " y") == [short]


@settings(max_examples=60)
@given(st.lists(DOC_TEXT, min_size=1, max_size=5, unique=True), st.randoms())
def test_detect_then_reorder_permutes_documents_and_keeps_separators(texts: list[str], rnd) -> None:
    registry = DocumentRegistry()
    ids = [registry.add(t) for t in texts]
    if len(set(ids)) != len(ids) or any(a != b and (f" {a} " in f" {b} ") for a in texts for b in texts):
        return  # one document inside another: ambiguous by construction
    prompt = "START " + "".join(f"[{i}] {t} ;; " for i, t in enumerate(texts)) + "END"
    spans = registry.spans(prompt)
    assert [s.doc_id for s in spans] == ids
    order = list(ids)
    rnd.shuffle(order)
    out = reorder_spans(prompt, spans, order)
    by_id = dict(zip(ids, texts, strict=True))
    assert out == "START " + "".join(f"[{i}] {by_id[d]} ;; " for i, d in enumerate(order)) + "END"
    assert registry.detect(out) == order


def test_payload_texts_reads_search_and_query_answers() -> None:
    search = {
        "result": [
            {"id": 1, "score": 0.9, "payload": {"text": "alpha"}},
            {"id": 2, "score": 0.8, "payload": {"page_content": "beta", "metadata": {}}},
            {"id": 3, "score": 0.7, "payload": {"_node_content": '{"text": "gamma"}'}},
            {"id": 4, "score": 0.6, "payload": {"other": 1}},
        ]
    }
    assert payload_texts(search) == ["alpha", "beta", "gamma"]
    assert payload_texts({"result": {"points": [{"payload": {"content": "delta"}}]}}) == ["delta"]
    assert payload_texts({"status": "ok"}) == []
