"""Context signatures and the final question."""

from __future__ import annotations

from typing import Any

import pytest

from normalizer.canonical_json import CanonicalizationError
from normalizer.documents import DocumentRegistry, PromptDocuments, read_prompt
from normalizer.signature import context_signature, final_question

SYSTEM = {"role": "system", "content": "You answer from the docs."}


def chat(
    question: Any = "What is RAG?", *, before: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    messages = [SYSTEM, *(before or []), {"role": "user", "content": question}]
    return {"model": "m", "messages": messages, **fields}


def digest(body: dict[str, Any], **kwargs: Any) -> str:
    signature = context_signature(body, **kwargs)
    assert signature is not None
    return signature.digest


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat(), "What is RAG?"),
        (
            chat(
                [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                    {"type": "text", "text": "b"},
                ]
            ),
            "a\nb",
        ),
        ({"model": "m", "messages": [SYSTEM, {"role": "assistant", "content": "hi"}]}, None),
        ({"model": "m", "messages": [{"role": "tool", "tool_call_id": "1", "content": "42"}]}, None),
        (chat([{"type": "image_url", "image_url": {"url": "u"}}]), None),
        ({"model": "m", "messages": []}, None),
        ({"model": "m"}, None),
    ],
)
def test_final_question(body: dict[str, Any], expected: str | None) -> None:
    assert final_question(body) == expected


def test_the_question_itself_is_not_part_of_the_signature() -> None:
    assert digest(chat("What is RAG?")) == digest(chat("Explain retrieval-augmented generation"))


def test_equivalent_encodings_share_a_signature() -> None:
    assert digest(chat()) == digest(chat([{"type": "text", "text": "other"}], temperature=1.0, stream=True))


def test_sampling_fields_are_compared_exactly_as_the_exact_key_does() -> None:
    assert digest(chat(temperature=0.3)) != digest(chat(temperature=1.2))
    assert digest(chat(temperature=0.3, seed=1)) != digest(chat(temperature=0.3, seed=2))
    assert digest(chat(top_p=0.9)) != digest(chat())
    assert digest(chat(temperature=1)) == digest(chat()), "a default filled in is the same request"


EARLIER = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}

DIFFERENT_CONTEXTS = [
    ("model", chat(), {**chat(), "model": "other"}),
    (
        "system prompt",
        chat(),
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "What is RAG?"},
            ],
        },
    ),
    ("no system prompt", chat(), {"model": "m", "messages": [{"role": "user", "content": "What is RAG?"}]}),
    ("earlier turns", chat(), chat(before=EARLIER)),
    ("tools", chat(), chat(tools=[TOOL])),
    ("tool choice", chat(tools=[TOOL]), chat(tools=[TOOL], tool_choice="required")),
    ("max tokens", chat(), chat(max_tokens=10)),
    ("response format", chat(), chat(response_format={"type": "json_object"})),
    (
        "attachments",
        chat([{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "a"}}]),
        chat([{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "b"}}]),
    ),
    (
        "user name",
        chat(),
        {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "x", "name": "bob"}]},
    ),
]


@pytest.mark.parametrize(
    ("case", "first", "second"), DIFFERENT_CONTEXTS, ids=[c for c, _, _ in DIFFERENT_CONTEXTS]
)
def test_a_different_context_gives_a_different_signature(
    case: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert digest(first) != digest(second)


def docs(*pairs: tuple[str, str]) -> PromptDocuments:
    """Structured documents as read from ``ragproxy.documents``."""
    return read_prompt(chat(), [{"id": doc_id, "text": text} for doc_id, text in pairs])


def test_which_documents_a_prompt_carries_is_evidence_not_identity() -> None:
    """Paraphrases that retrieved other documents, or the same in another order, share a signature (whether the
    cached answer's documents are still carried is :mod:`normalizer.evidence`'s decision); a question asked with
    documents never shares one with a question asked without, nor across knowledge versions."""
    base = digest(chat(), prompt=docs(("d1", "alpha"), ("d2", "beta")), knowledge_version="3")
    assert base == digest(chat(), prompt=docs(("d2", "beta"), ("d1", "alpha")), knowledge_version="3"), "order"
    assert base == digest(chat(), prompt=docs(("d1", "alpha")), knowledge_version="3"), "set"
    assert base == digest(chat(), prompt=docs(("d1", "alpha"), ("d2", "gamma")), knowledge_version="3"), "text"
    assert base != digest(chat(), prompt=docs(("d1", "alpha"), ("d2", "beta")), knowledge_version="4")
    assert digest(chat(), prompt=docs(("d1", "alpha"))) != digest(chat())


def test_document_parts_are_cut_out_of_every_message() -> None:
    def with_parts(text: str, question: str) -> dict[str, Any]:
        return {"model": "m", "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                           {"type": "document", "id": "s", "text": text}]},
            {"role": "user", "content": [{"type": "document", "text": text + " more"},
                                         {"type": "text", "text": question}]}]}

    def signed(body: dict[str, Any]) -> str:
        return digest(body, prompt=read_prompt(body))

    assert signed(with_parts("one passage", "why?")) == signed(with_parts("another passage", "why?"))
    assert signed(with_parts("one passage", "why?")) != digest({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "why?"}]}), "with and without"


def test_recognised_documents_are_cut_out_of_the_question_and_of_the_signature() -> None:
    registry = DocumentRegistry()
    passages = ["the first passage says many things about a topic", "another passage with other words in it",
                "a third passage that nobody asked about at all"]
    for text in passages:
        registry.add(text)

    def asked(context: list[str], question: str) -> dict[str, Any]:
        return chat("Context:\n" + "\n".join(context) + "\nQuestion: " + question)

    def signed(body: dict[str, Any]) -> str:
        return digest(body, prompt=read_prompt(body, registry=registry))

    body = asked(passages[:2], "what does it say?")
    prompt = read_prompt(body, registry=registry)
    assert final_question(body, prompt) == "Context:\nQuestion: what does it say?"
    assert signed(body) == signed(asked(passages[1::-1], "what does it say?")) == signed(asked(passages[1:], "x"))
    in_system = [{"role": "system", "content": "Use these:\n" + "\n\n".join(passages[:2])},
                 {"role": "user", "content": "what does it say?"}]
    other_system = [{**in_system[0], "content": "Use these:\n" + passages[2]}, in_system[1]]
    assert signed({"model": "m", "messages": in_system}) == signed({"model": "m", "messages": other_system})
    assert signed({"model": "m", "messages": in_system}) != signed(
        {"model": "m", "messages": [{**in_system[0], "content": "Use only these:\n" + passages[2]}, in_system[1]]})


def test_signature_fields() -> None:
    signature = context_signature(chat(before=EARLIER, tools=[TOOL]), prompt=docs(("b", "x"), ("a", "y")))
    assert signature is not None
    assert signature.model == "m"
    assert signature.system == [{"role": "system", "content": [{"type": "text", "text": SYSTEM["content"]}]}]
    assert [message["role"] for message in signature.history] == ["user", "assistant"]
    assert signature.tools["tool_choice"] == "auto"
    assert signature.documents is True
    assert len(signature.digest) == 64


def test_no_signature_without_a_final_question_and_errors_on_malformed_bodies() -> None:
    assert context_signature({"model": "m", "messages": [{"role": "assistant", "content": "x"}]}) is None
    with pytest.raises(CanonicalizationError):
        context_signature({"messages": [{"role": "user", "content": "x"}]})


def test_response_signature_covers_everything_but_the_question() -> None:
    from normalizer.signature import response_signature

    def sig(**fields: Any) -> str | None:
        body = {"model": "m", "input": "What is RAG?", "instructions": "Be brief.", "store": False, **fields}
        signature = response_signature(body)
        return None if signature is None else signature.digest

    base = sig()
    assert base is not None and sig(input="what's rag") == base, "only the question differs"
    assert sig(metadata={"run": 2}, user="u") == base, "fields outside the key are outside the context too"
    for other in ({"instructions": "Be long."}, {"temperature": 0.2}, {"max_output_tokens": 9},
                  {"previous_response_id": "resp_1"},
                  {"tools": [{"type": "function", "name": "f"}]}, {"text": {"format": {"type": "json_object"}}},
                  {"model": "n"}, {"reasoning": {"effort": "high"}},
                  {"input": [{"role": "assistant", "content": "Earlier."},
                             {"role": "user", "content": "What is RAG?"}]},
                  {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is RAG?"},
                                                          {"type": "input_image", "file_id": "file_1"}]}]}):
        assert sig(**other) not in (None, base), other
    assert sig(input=[{"type": "function_call_output", "call_id": "c", "output": "1"}]) is None
    chat = context_signature({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "What is RAG?"}]})
    assert chat is not None and chat.digest != base, "a chat question never shares a Responses context"


def test_every_text_part_of_the_question_counts() -> None:
    """A final message's ``input_text`` part (the Responses spelling some chat servers accept) is text: two questions
    that differ only there never share both question and signature."""
    def body(detail: str) -> dict[str, Any]:
        return {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Summarise the report"}, {"type": "input_text", "text": detail}]}]}

    one, other = body("for 2023"), body("for 2024")
    assert (final_question(one), context_signature(one)) != (final_question(other), context_signature(other))
