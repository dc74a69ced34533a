"""What a cached answer rests on, and whether a new prompt still carries it."""

from __future__ import annotations

import orjson
import pytest

from normalizer.documents import Document, content_id
from normalizer.evidence import MAX_DOCUMENTS, evidence, renumbered, unsupported, without_citations

A, B, C = Document("a", "Alpha text."), Document("b", "Beta text.", "Beta handbook"), Document("c", "Gamma text.")


def supports(kept: object, documents: tuple[Document, ...]) -> bool:
    return unsupported(kept, documents) is None


def cited(answer: str, documents: tuple[Document, ...] = (A, B, C)) -> object:
    kept = evidence(answer, documents)
    assert kept is not None
    return kept["cited"]


def rests_on(answer: str, documents: tuple[Document, ...], question: str = "") -> object:
    kept = orjson.loads(orjson.dumps(evidence(answer, documents, question)))
    return [kept["documents"][index][0] for index in kept["rests_on"]]


@pytest.mark.parametrize(("answer", "expected"), [
    ("It is alpha [a].", [[0, "a"]]),
    ("Both [a, c].", [[0, "a"], [0, "c"]]),
    ("See [2].", [[2, "b"]]),
    ("See [1][3] and [Source 2].", [[1, "a"], [3, "c"], [2, "b"]]),
    ("See [doc 2; Document 3].", [[2, "b"], [3, "c"]]),
    ("See 【1】.", [[1, "a"]]),
    ("As the Beta handbook says.", [[0, "b"]]),
    ("Nothing cited, not even [7] or [a note].", None),
])
def test_citations_by_id_position_and_title(answer: str, expected: object) -> None:
    assert cited(answer) == expected


def test_no_documents_no_evidence() -> None:
    assert evidence("anything [1]", ()) is None
    assert supports(None, (A,)), "an answer given without documents needs none"


def test_an_uncited_answer_rests_on_the_documents_whose_content_it_uses() -> None:
    dose = Document("kb-1", "Paracetamol for adults: 500 mg every four to six hours, at most 4 g a day.")
    storage = Document("kb-2", "Keep paracetamol below 25 degrees, away from children and damp.")
    question = "How much paracetamol can an adult take?"
    kept = evidence("Take 500 mg every four to six hours, never more than 4 g a day.", (dose, storage), question)
    assert rests_on("Take 500 mg every four to six hours, never more than 4 g a day.", (dose, storage), question) \
        == ["kb-1"]
    assert supports(kept, (Document("kb-9", "Unrelated."), dose)), "the document it uses is carried: any order"
    assert not supports(kept, (storage,)), "the document it uses is missing"
    assert rests_on("It depends on the patient.", (dose, storage), question) == [], \
        "content from none of its documents: rests on none"
    assert supports(evidence("It depends on the patient.", (dose, storage), question), (storage,))
    assert rests_on("Paracetamol, as in every leaflet.", (dose, storage), question) == [], \
        "words every document holds tell none apart"


def test_a_few_topic_words_shared_with_another_document_do_not_make_it_a_source() -> None:
    leaflet = Document("kb-1", "Ibuprofen tablets: adults take one tablet with food, three times daily, "
                               "swallowed whole with water; stop if stomach pain appears.")
    other = Document("kb-2", "Store tablets with food products away? Never: keep tablets dry, below 25 degrees.")
    third = Document("kb-3", "Aspirin is not for children under 16.")
    answer = "Adults take one tablet with food three times daily, swallowed whole with water; stop on stomach pain."
    assert rests_on(answer, (leaflet, other, third), "How should I take ibuprofen?") == ["kb-1"]
    assert rests_on(answer + " Not for children under 16.", (leaflet, other, third), "How should I take ibuprofen?") \
        == ["kb-1", "kb-3"], "a figure only one document holds makes it a source"


def test_an_added_document_vetoes_when_it_restates_a_figure_or_a_third_of_the_words() -> None:
    leaflet = Document("kb-1", "Paracetamol for adults: 500 mg every four to six hours, with water, not alcohol.")
    question = "What is the adult dose of paracetamol?"
    kept = evidence("Take 500 mg every four to six hours, with water, never with alcohol [1].", (leaflet,), question)
    erratum = Document("kb-7", "Erratum: the dose is now 1000 mg; 500 mg is outdated.")
    same_words = Document("kb-8", "Never mix alcohol with medicines; take them with water every morning.")
    topical = Document("kb-9", "Paracetamol comes as tablets and syrup; keep it away from water.")
    assert unsupported(kept, (erratum, leaflet)) == "added_document", "it restates the answer's figure"
    assert unsupported(kept, (leaflet, same_words)) == "added_document", "a third of the answer's words"
    assert unsupported(kept, (topical, leaflet)) is None, "one word of the answer's, on the same subject"
    assert unsupported(evidence("Take 500 mg [1].", (leaflet, erratum), question), (erratum, leaflet)) is None, \
        "a document the answer was given is no addition"


def test_words_the_question_carries_are_not_the_answers_content() -> None:
    doc = Document("kb-1", "Sourdough bread needs a starter and a long proof.")
    assert rests_on("Sourdough bread is easy.", (doc, A), "How do I make sourdough bread?") == []
    assert rests_on("Sourdough bread is easy.", (doc, A), "How do I bake?") == ["kb-1"]


CITING = ["[2]", "[doc-2]", "[source: doc-2]", "[Source: doc-2]", "(doc-2)", ", see doc-2", "[ref #2]",
          "(from the Second handbook)", "【2:0†source】", "[cite: doc-2]"]


@pytest.mark.parametrize("citation", CITING)
def test_a_citation_in_any_form_is_a_signal(citation: str) -> None:
    # one word of the answer's own is too little to tell its source by content, and two documents hold it: the
    # citation tells which
    documents = (Document("doc-1", "One."), Document("doc-2", "Two harbours.", "Second handbook"),
                 Document("doc-3", "Three harbours."))
    answer = f"It is about harbours {citation}."
    assert rests_on(answer, documents) == ["doc-2"], answer
    kept = evidence(answer, documents)
    assert supports(kept, documents[1:]) and not supports(kept, (documents[0], documents[2]))


IN_PROSE = ["(doc-2)", ", see doc-2", "(from the Second handbook)"]


@pytest.mark.parametrize("citation", CITING)
def test_a_citation_its_document_does_not_bear_out_is_not_what_the_answer_rests_on(citation: str) -> None:
    documents = (Document("doc-1", "One."), Document("doc-2", "Two.", "Second handbook"), Document("doc-3", "Three."))
    # a bracketed citation can be taken out of a copy served where its document is missing; a name in the prose cannot
    expected = ["doc-2"] if citation in IN_PROSE else []
    assert rests_on(f"The ferry leaves at 42 past {citation}.", documents) == expected, "its content comes from none"
    assert rests_on(f"Yes {citation}.", documents) == ["doc-2"], "no content of its own: the citation is all there is"


def test_a_served_answer_loses_the_citations_of_documents_the_new_prompt_lacks() -> None:
    given = (Document("doc-1", "One."), Document("doc-2", "Two."), Document("doc-3", "Three."))
    answer = "The ferry leaves at 42 past [2], from pier 7 [1, 3] [doc-2]."
    kept = evidence(answer, given)
    now = (Document("doc-3", "Three."), Document("doc-9", "Nine."))
    assert supports(kept, now), "it rests on none of them"
    assert renumbered(answer, kept, now) == "The ferry leaves at 42 past, from pier 7 [1]."
    assert renumbered(answer, kept, given) == answer


def test_evidence_written_before_rests_on_keeps_its_meaning() -> None:
    old = {"documents": [["a", content_id(A.text)]], "cited": None}
    assert supports(old, (A, B)) and not supports(old, (B,)), "no rests_on: an uncited answer rests on all"


def test_a_cited_answer_rests_on_what_it_cites() -> None:
    by_id = evidence("Alpha [a].", (A, B))
    assert supports(by_id, (C, A)), "cited by id: any position"
    assert not supports(by_id, (B, C))
    by_position = evidence("Beta [2].", (A, B))
    assert supports(by_position, (C, B)) and supports(by_position, (B, C)), "cited by position: carried anywhere"
    assert not supports(by_position, (A, C))


def test_positions_are_renumbered_to_where_the_new_prompt_holds_the_document() -> None:
    answer = "Beta [2], and gamma [Source 3; doc 1]; not a[2] nor f(x)[3]. [b] stays."
    kept = evidence(answer, (A, B, C))
    assert renumbered(answer, kept, (C, A, B)) == \
        "Beta [3], and gamma [Source 1; doc 2]; not a[2] nor f(x)[3]. [b] stays."
    assert renumbered(answer, kept, (A, B, C)) == answer
    assert renumbered("By id [a].", evidence("By id [a].", (A, B)), (B, A)) == "By id [a]."
    numeric = (Document("2", "Two."), Document("1", "One."))
    assert renumbered("Cited by id [2].", evidence("Cited by id [2].", numeric), numeric[::-1]) == "Cited by id [2].", \
        "a token that is a document's id is left as written"


def test_a_document_that_changed_its_text_never_supports() -> None:
    kept = evidence("Alpha [a].", (A, B))
    assert not supports(kept, (Document("a", "Alpha, rewritten."),))
    assert not supports(kept, (A, Document("b", "Beta, rewritten."))), "even one the answer does not cite"


def test_malformed_evidence_supports_nothing() -> None:
    assert not supports({"cited": None}, (A,))
    assert not supports("evidence", (A,))
    assert not supports({"documents": [["a"]], "cited": None}, (A,))
    assert not supports({"documents": [["a", "x"]], "cited": [["one", "a"]]}, (A,))
    assert not supports({"documents": [["a", content_id(A.text)]], "rests_on": [3]}, (A,))


def test_answers_are_compared_without_their_citations() -> None:
    cited = "Austen wrote it [doc-3], in 1813 [2]; see a[1]."
    assert without_citations(cited) == "Austen wrote it , in 1813 ; see a[1]."


def test_evidence_is_bounded_whatever_the_client_sends() -> None:
    many = tuple(Document(f"d{i}", f"text {i}") for i in range(MAX_DOCUMENTS + 1))
    kept = evidence("Cites nothing.", many)
    assert kept == {"too_many": MAX_DOCUMENTS + 1} and not supports(kept, many), "exact repeats only"
    long_id = Document("x" * 10_000, "Long id text.")
    kept = evidence("Yes [1].", (long_id, A))
    assert len(orjson.dumps(kept)) < 300
    assert supports(kept, (A, long_id)) and not supports(kept, (A,))
    wordy = evidence(" ".join(f"word{i:03d}xyz" * 3 for i in range(500)), (A, B))
    assert wordy is not None and len(orjson.loads(orjson.dumps(wordy))["content"]) <= 24
    assert len(orjson.dumps(wordy)) < 1200
