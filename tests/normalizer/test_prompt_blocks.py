"""Documents recognised from a prompt's own structure (:mod:`normalizer.prompt_blocks`): the shapes apps paste
documents in, and the shapes that only look alike (lists in a question, code, numbered steps)."""

from __future__ import annotations

import pytest

from normalizer.documents import DocumentRegistry, content_id, read_prompt
from normalizer.evidence import evidence, unsupported
from normalizer.prompt_blocks import recognise
from normalizer.prompt_plan import plan_request
from normalizer.signature import context_signature, final_question

A = "The Eiffel Tower was completed in 1889 as the entrance arch of the World's Fair in Paris."
B = "Gustave Eiffel's engineering company designed and built the wrought-iron tower in two years."
C = "It remained the tallest man-made structure in the world until the Chrysler Building in 1930."
QUESTION = "Question: when was the Eiffel Tower built?"


def texts(prompt: str) -> list[str]:
    return [prompt[b.start : b.end] for b in recognise(prompt)]


SHAPES = {
    "bracket numbers": (f"Use these passages.\n\n[1] {A}\n[2] {B}\n[3] {C}\n\n{QUESTION}", [A, B, C]),
    "bracket numbers, last line then question": (f"[1] {A}\n[2] {B}\n[3] {C}\n{QUESTION}", [A, B, C]),
    "document n colon, multi-line": (
        f"Context:\nDocument 1:\nTitle one\n{A}\n\nDocument 2:\nTitle two\n{B}\n\n{QUESTION}",
        [f"Title one\n{A}", f"Title two\n{B}"],
    ),
    "source n, bold": (f"**Source 1:** {A}\n**Source 2:** {B}\n\n{QUESTION}", [A, B]),
    "bracketed word labels": (f"[Doc 1] {A}\n[Doc 2] {B}\n[Doc 3] {C}\n\n{QUESTION}", [A, B, C]),
    "passage n, numbered from 0": (f"Passage 0. {A}\nPassage 1. {B}\n\n{QUESTION}", [A, B]),
    "cjk brackets": (f"【1】{A}\n【2】{B}\n\n{QUESTION}", [A, B]),
    "document tags": (
        f'<documents>\n<document index="1">\n{A}\n</document>\n<document index="2">\n{B}\n</document>\n'
        f"</documents>\n{QUESTION}",
        [f'<document index="1">\n{A}\n</document>', f'<document index="2">\n{B}\n</document>'],
    ),
    "doc tags with ids, sources inside": (
        f'<doc id="a1"><source>wiki</source>{A}</doc>\n<doc id="b2"><source>wiki</source>{B}</doc>\n{QUESTION}',
        [f'<doc id="a1"><source>wiki</source>{A}</doc>', f'<doc id="b2"><source>wiki</source>{B}</doc>'],
    ),
    "plain fences": (f"Context:\n```\n{A}\n```\n```\n{B}\n```\n{QUESTION}", [A, B]),
    "labels inside tags: the elements": (
        f"<document>\nDocument 1: {A}\n</document>\n<document>\nDocument 2: {B}\n</document>\n{QUESTION}",
        [f"<document>\nDocument 1: {A}\n</document>", f"<document>\nDocument 2: {B}\n</document>"],
    ),
    "tags inside passages: the passages": (
        f"[1] {A} <doc>{B}</doc>\n[2] {C} <doc>{A}</doc>\n\n{QUESTION}",
        [f"{A} <doc>{B}</doc>", f"{C} <doc>{A}</doc>"],
    ),
    "rules": (f"Context below.\n---\n{A}\n---\n{B}\n---\n{C}\n---\n{QUESTION}", [A, B, C]),
}


@pytest.mark.parametrize(("prompt", "expected"), SHAPES.values(), ids=SHAPES.keys())
def test_shapes_apps_paste_documents_in_are_recognised(prompt: str, expected: list[str]) -> None:
    assert texts(prompt) == expected


STEPS = "\n".join(
    f"{n}. Take the next step of the recipe with care and stir the pot slowly for a while now." for n in (1, 2, 3)
)
NOT_DOCUMENTS = {
    "numbered steps": f"How do I make this better?\n{STEPS}",
    "numbered steps with parentheses": "Which is right?\n1) " + A + "\n2) " + B,
    "a list of bullets": f"Compare these:\n- {A}\n- {B}\n- {C}",
    "one passage": f"[1] {A}\n\n{QUESTION}",
    "numbers that do not count up": f"[1] {A}\n[3] {B}\n\n{QUESTION}",
    "short numbered lines": "[1] see page four\n[2] see page five\n[3] see page six",
    "citations inside prose": f"As [1] says, {A} And [2] adds that {B}",
    "a passage repeated": f"[1] {A}\n[2] {A}\n\n{QUESTION}",
    "multi-paragraph passages: the last one's end is unknown": f"[1] {A}\n\n{B}\n[2] {C}\n\n{B}\n\n{QUESTION}",
    "code fences with a language": f"My code:\n```python\nx = compute({A!r})\n```\n```python\ny = 2\n```",
    "code fences without a language": (
        "Why does this fail?\n```\nfor item in items: total = total + item.price * item.count\n```\n"
        "```\nTraceback (most recent call last): File main.py, line 3, in <module>\n```"
    ),
    "one document tag": f"<document>{A}</document>\n{QUESTION}",
    "nested document tags": f"<doc><doc>{A}</doc>{B}</doc>",
    "unclosed document tags": f"<doc>{A}\n<doc>{B}\n{QUESTION}",
    "a setext heading and one rule": f"Title\n---\n{A}\n---\n{B}",
    "mixed rules": f"---\n{A}\n***\n{B}\n---",
    "plain text": f"{A} {B} {C}",
    "passages cutting through tags": f"[1] {A}\n<doc>\n[2] {B}\n</doc>\n[3] {C}",
    "passages cutting through a fence pair": f"[1] {A}\n```\n[2] {B}\n```\n[3] {C}",
}


@pytest.mark.parametrize("prompt", NOT_DOCUMENTS.values(), ids=NOT_DOCUMENTS.keys())
def test_shapes_that_only_look_alike_are_left_as_sent(prompt: str) -> None:
    assert recognise(prompt) == ()


def body(content: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "Answer from the passages."}, {"role": "user", "content": content}],
    }


def test_recognised_blocks_are_the_documents_kv_planning_and_the_semantic_tier_read() -> None:
    prompt_text = f"[1] {A}\n[2] {B}\n[3] {C}\n\n{QUESTION}"
    chat = body(prompt_text)
    prompt = read_prompt(chat, None, DocumentRegistry())
    assert prompt.mode == "detected"
    assert [d.id for d in prompt.documents] == [content_id(A), content_id(B), content_id(C)]
    assert final_question(chat, prompt) == f"[1]\n[2]\n[3]\n{QUESTION}"  # the question without the documents

    plan = plan_request(chat, prompt)
    assert plan is not None and [s.key for s in plan.documents] == [content_id(t) for t in (A, B, C)]
    reordered = plan.render_messages([plan.documents[2], plan.documents[0], plan.documents[1]])
    hint = "Relevance order of the passages above, most relevant first: 2, 3, 1."  # A went to [2], B to [3], C to [1]
    assert reordered[1]["content"] == f"[1] {C}\n[2] {A}\n[3] {B}\n{hint}\n\n{QUESTION}"  # labels stay in place


def test_without_a_registry_nothing_is_recognised_and_a_registered_find_wins_ties() -> None:
    chat = body(f"[1] {A}\n[2] {B}\n\n{QUESTION}")
    assert read_prompt(chat, None, None).mode == "plain"
    registry = DocumentRegistry()
    registry.add(A, "doc-a")
    registry.add(B, "doc-b")
    assert [d.id for d in read_prompt(chat, None, registry).documents] == ["doc-a", "doc-b"]


def test_an_assistants_numbered_list_is_not_a_pasted_document() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Tell me about the tower."},
            {"role": "assistant", "content": f"[1] {A}\n[2] {B}"},
            {"role": "user", "content": "And who built it?"},
        ],
    }
    assert read_prompt(chat, None, DocumentRegistry()).mode == "plain"


def test_the_semantic_context_of_pasted_passages_leaves_out_their_order_and_keeps_them_as_evidence() -> None:
    """Two prompts pasting the same passages in another order, one question: one context for the semantic tier,
    and the passages are the documents an answer's evidence is checked against."""
    first, second = body(f"[1] {A}\n[2] {B}\n\n{QUESTION}"), body(f"[1] {B}\n[2] {A}\n\n{QUESTION}")
    prompts = [read_prompt(chat, None, DocumentRegistry()) for chat in (first, second)]
    signatures = [context_signature(chat, prompt=prompt) for chat, prompt in zip((first, second), prompts, strict=True)]
    assert signatures[0] is not None and signatures[1] is not None
    assert signatures[0].digest == signatures[1].digest
    assert {d.id for d in prompts[1].documents} == {content_id(A), content_id(B)}
    assert unsupported(evidence("Built in 1889 [1].", prompts[0].documents), prompts[1].documents) is None
