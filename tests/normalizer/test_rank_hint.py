"""The rank hint: a reordered prompt states the retrieval order after its documents, leaving the prefix intact."""

from __future__ import annotations

from typing import Any

from normalizer.documents import DocumentRegistry, read_prompt
from normalizer.prompt_plan import PromptPlan, estimate_tokens, moved_positions, plan_request, plan_response

TEXTS = {
    "a": "Alpine lakes freeze from the edges inward because shallow water loses heat first.",
    "b": "Basalt columns form as lava cools and contracts into hexagonal joints over years.",
    "c": "Coral reefs grow a few millimetres a year where warm shallow water stays clear.",
}


def structured(*names: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "Use the documents."}, {"role": "user", "content": "why?"}],
        "ragproxy": {"documents": [{"id": n, "text": TEXTS[n]} for n in names]},
    }


def numbered(*names: str) -> dict[str, Any]:
    context = "\n".join(f"[{i + 1}] {TEXTS[n]}" for i, n in enumerate(names))
    return {"model": "m", "messages": [{"role": "user", "content": f"Context:\n{context}\nQuestion: why?"}]}


def plan(body: dict[str, Any]) -> PromptPlan:
    result = plan_request(body, read_prompt(body, body.get("ragproxy", {}).get("documents"), DocumentRegistry()))
    assert result is not None and result.rewrites
    return result


def render(body: dict[str, Any], order: str) -> str:
    """The system message of a structured body rendered with its documents in ``order`` (their ids)."""
    segments = {s.key: s for s in plan(body).documents}
    return str(plan(body).render_messages([segments[k] for k in order])[0]["content"])


def structured_system(*names: str) -> str:
    """What a client sending the documents in this order gets (the retrieval order rendered as is)."""
    return render(structured(*names), "".join(names))


def test_the_retrieval_order_renders_as_sent_without_a_hint() -> None:
    assert "Relevance order" not in structured_system("b", "c", "a")
    body = numbered("b", "c", "a")
    assert plan(body).render_messages(plan(body).documents) == body["messages"]


def test_a_reordered_structured_prompt_names_the_documents_best_first_after_the_last_one() -> None:
    sent = render(structured("b", "c", "a"), "abc")  # retrieval b, c, a; rendered a, b, c
    as_if_sent_so = structured_system("a", "b", "c")
    assert sent.startswith(as_if_sent_so)  # every byte of the cached prefix is the hint-free rendering's
    assert sent[len(as_if_sent_so):] == "Relevance order of the documents above, most relevant first: b, c, a.\n"


def test_two_retrieval_orders_rendered_in_one_order_share_everything_up_to_the_hint() -> None:
    first, second = render(structured("b", "c", "a"), "abc"), render(structured("c", "a", "b"), "abc")
    end = first.rindex("</document>\n") + len("</document>\n")
    assert first[:end] == second[:end] and first[end:] != second[end:]
    assert render(structured("b", "c", "a"), "abc") == first  # deterministic


def test_reordered_passages_keep_their_labels_and_the_hint_gives_the_positions_of_the_best_first() -> None:
    body = numbered("b", "c", "a")
    segments = plan(body).documents  # detected blocks: ids are content hashes, in retrieval order b, c, a
    order = [segments[2], segments[0], segments[1]]  # a, b, c
    sent = str(plan(body).render_messages(order)[0]["content"])
    expected = numbered("a", "b", "c")["messages"][0]["content"]
    hint = "\nRelevance order of the passages above, most relevant first: 2, 3, 1."  # b at [2], c at [3], a at [1]
    assert sent == expected.replace("\nQuestion:", hint + "\nQuestion:")


def test_moved_positions_follow_repeated_keys_in_order() -> None:
    assert moved_positions(["x", "y"], ["x", "y"]) is None
    assert moved_positions(["x", "y", "x"], ["y", "x", "x"]) == [2, 1, 3]


def test_an_orders_rank_hint_counts_in_its_estimated_tail_and_length() -> None:
    body = structured("b", "c", "a")
    planned = plan(body)
    segments = {s.key: s for s in planned.documents}
    reordered = [segments[k] for k in "abc"]
    line = render(body, "abc")[len(structured_system("a", "b", "c")):]  # the hint, as rendered
    assert line.startswith("Relevance order")
    assert planned.tail_tokens_for(reordered) == planned.tail_tokens + estimate_tokens(line)
    assert planned.total_tokens(reordered) == planned.total_tokens(planned.documents) + estimate_tokens(line)
    assert planned.tail_tokens_for(planned.documents) == planned.tail_tokens  # the retrieval order adds none


def test_passages_reordered_count_their_hint_and_a_body_forwarded_as_sent_counts_none() -> None:
    body = numbered("b", "c", "a")
    planned = plan(body)
    order = [planned.documents[2], planned.documents[0], planned.documents[1]]
    sent = str(planned.render_messages(order)[0]["content"])
    line = sent[sent.index("\nRelevance order"):sent.index("\nQuestion:")]
    assert planned.tail_tokens_for(order) == planned.tail_tokens + estimate_tokens(line)
    responses = {"model": "m", "input": body["messages"][0]["content"]}
    as_sent = plan_response(responses, read_prompt({"messages": body["messages"]}, None, DocumentRegistry()))
    assert as_sent is not None and not as_sent.rewrites
    assert as_sent.tail_tokens_for(list(reversed(as_sent.documents))) == as_sent.tail_tokens
