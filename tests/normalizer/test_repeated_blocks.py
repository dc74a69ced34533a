"""Blank-line paragraphs that move between requests count as documents; the app's own text never does."""

from __future__ import annotations

import itertools

from normalizer.documents import DocumentRegistry, content_id, read_prompt
from normalizer.evidence import evidence, unsupported
from normalizer.prompt_plan import plan_request
from normalizer.repeated_blocks import ENTRY_BYTES, MAX_PARAGRAPHS, RepeatedBlocks

CHUNKS = [
    "The Eiffel Tower was completed in 1889 as the entrance arch of the World's Fair in Paris.",
    "Gustave Eiffel's engineering company designed and built the wrought-iron tower in two years.",
    "It remained the tallest man-made structure in the world until the Chrysler Building in 1930.",
    "The tower is repainted every seven years with about sixty tonnes of paint in three shades.",
    "Its top platform sits 276 metres above the ground and is reached by two successive lifts.",
]
A, B, C, D, E = CHUNKS
SYSTEM = "You are a helpful assistant for a travel company and you answer in the user's own language."
HEADER = "Use the context below to answer the question. Cite nothing and keep your answer short and friendly."
RULES = "Answer only from the context above, and say so plainly when the context does not hold the answer."


def prompt(chunks: list[str], question: str) -> str:
    """An app's user message: its fixed header, the chunks joined by blank lines, fixed rules, the question."""
    return "\n\n".join([HEADER, *chunks, RULES, f"Question: {question}"])


def test_a_chunk_counts_once_it_met_other_neighbours_on_both_sides_at_other_distances() -> None:
    repeated = RepeatedBlocks(1024 * 1024)
    assert repeated.observe(prompt([A, B, C], "when was it built?")) == []
    # C moved to the front: other neighbours on both sides, other distances; A and B kept one neighbour each
    assert repeated.observe(prompt([C, A, B], "who designed it?")) == [C]
    # B first, A last: each has now met a second neighbour on both sides
    assert repeated.observe(prompt([B, C, A], "how tall was it?")) == [B, C, A]
    assert repeated.observe(prompt([A, D], "what about its paint?")) == [A], "D is new, A counted before"


def test_the_apps_fixed_text_never_counts_however_the_chunks_rotate() -> None:
    """The header always follows the message's start, the rules always precede the question: whatever neighbours
    the chunks give them, each keeps one side (or its distance from one edge) fixed."""
    repeated = RepeatedBlocks(1024 * 1024)
    counted: set[str] = set()
    for n, chunks in enumerate(itertools.permutations(CHUNKS, 3)):
        counted.update(repeated.observe(prompt(list(chunks), f"question number {n} about the tower?")))
        counted.update(repeated.observe("\n\n".join([SYSTEM, *chunks])))  # a system message with the chunks
    assert counted == set(CHUNKS)


def test_short_paragraphs_and_multi_paragraph_chunks_never_count() -> None:
    short = ["Paris, 1889.", "Two lifts.", "Sixty tonnes."]
    first, second = "The first paragraph of a long chunk about the tower and its history.", \
        "The second paragraph of the same chunk, which always follows the first one."
    repeated = RepeatedBlocks(1024 * 1024)
    counted: set[str] = set()
    for n, order in enumerate(itertools.permutations(range(3))):
        chunks = [[short[i], f"{first}\n\n{second}", A][i] for i in order]
        counted.update(repeated.observe(prompt([*chunks, CHUNKS[n % 3 + 1]], f"question {n}?")))
    assert A in counted
    assert not counted & {*short, first, second}


def test_the_budget_bounds_the_paragraphs_kept_and_a_forgotten_one_starts_over() -> None:
    repeated = RepeatedBlocks(10 * ENTRY_BYTES)
    assert repeated.capacity == 10
    repeated.observe(prompt([A, B, C], "first question of the series?"))
    for n in range(20):  # 20 other chunks, each seen once: A, B, C are pushed out
        repeated.observe(prompt([f"Filler chunk number {n} with enough words to be kept as a paragraph."],
                                "another question"))
    assert len(repeated) == 10 and repeated.bytes == 10 * ENTRY_BYTES <= repeated.max_bytes
    assert repeated.evicted > 0
    assert repeated.observe(prompt([C, A, B], "who designed it?")) == [], "C was forgotten: this is its first sighting"
    assert repeated.observe(prompt([A, B, C], "when was it built?")) == [C]


def test_a_message_of_too_many_paragraphs_is_not_observed() -> None:
    repeated = RepeatedBlocks(1024 * 1024)
    book = [f"Paragraph {n} of a long pasted text, with words enough to count as a chunk."
            for n in range(MAX_PARAGRAPHS + 1)]
    repeated.observe("\n\n".join(book))
    assert len(repeated) == 0


def body(text: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}


def test_read_prompt_recognises_moved_chunks_for_kv_order_and_evidence() -> None:
    """The chunks that counted are registered: the planner reorders them whole, the evidence rests on them."""
    registry, repeated = DocumentRegistry(), RepeatedBlocks(1024 * 1024)
    plain = read_prompt(body(prompt([A, B, C], "when was it built?")), None, registry, repeated)
    assert plain.mode == "plain" and len(registry) == 0, "no text is held before a paragraph counts"
    second = read_prompt(body(prompt([C, A, B], "who designed it?")), None, registry, repeated)
    assert [d.text for d in second.documents] == [C] and len(registry) == 1, "the request that makes C count uses it"
    chat = body(prompt([B, C, A], "when was the tower built?"))
    found = read_prompt(chat, None, registry, repeated)
    assert found.mode == "detected"
    assert [d.id for d in found.documents] == [content_id(B), content_id(C), content_id(A)]
    assert [d.text for d in found.documents] == [B, C, A]
    assert read_prompt(chat, None, registry).mode == "detected", "registered: found without observing again"

    plan = plan_request(chat, found)
    assert plan is not None and [s.key for s in plan.documents] == [content_id(t) for t in (B, C, A)]
    reordered = plan.render_messages([plan.documents[2], plan.documents[0], plan.documents[1]])[1]["content"]
    hint = "Relevance order of the passages above, most relevant first: 2, 3, 1."  # B went to 2, C to 3, A to 1
    assert reordered == "\n\n".join([HEADER, A, B, f"{C}\n{hint}", RULES, "Question: when was the tower built?"])

    kept = evidence("It was completed in 1889.", found.documents, "when was the tower built?")
    assert kept is not None and unsupported(kept, found.documents) is None
    assert unsupported(kept, [d for d in found.documents if d.text != A]) is not None, "it rests on A"


def test_short_messages_are_not_observed() -> None:
    repeated = RepeatedBlocks(1024 * 1024)
    read_prompt(body("Paris.\n\nWhen was the tower built, and by whom?"), None, DocumentRegistry(), repeated)
    assert len(repeated) == 0
