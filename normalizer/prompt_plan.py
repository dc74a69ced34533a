"""A chat request as a KV prefix ``[prefix segment, D1, D2, ...] + tail``, and how to render any order of it.

:func:`plan_request` builds a :class:`PromptPlan` from a chat-completions body and its documents, read once
before the cache tiers (:func:`normalizer.documents.read_prompt`):

* structured mode (documents sent apart, see :mod:`normalizer.documents`): the prefix segment is the system
  prompt, the documents are the sent ones (retrieval order), the tail is the rest of the conversation;
* detection mode (documents recognised in a message's text: registered ones, or blocks of the text's own
  structure, :mod:`normalizer.prompt_blocks`): the message holding the most is the
  document message, the prefix segment is everything before its first document (earlier messages included), the
  tail everything after its last;
  reordering permutes the documents in place and keeps the app's separators where they are;
* otherwise the whole conversation but the last message is the prefix segment and there are no documents (a
  one-message prompt has an empty prefix and an empty path: nothing for the tree, no prefix hints).

:func:`plan_response` plans a Responses body (``/v1/responses``) from its chat view, with the same segments, but
never rewrites it: the body goes out in its own shape, documents in the order sent.

Rank hint: when an order other than the retrieval order is rendered, the model would otherwise read the
documents' relevance from their new positions. One line after the last document (:func:`rank_hint`) then states
the retrieval order: by document id (structured mode: each block carries its ``id``) or by position (detection
mode: the app's labels stay in place, so ``[2]`` heads the second block after a reorder and position is what the
labels say). It goes *after* the documents so that everything before it — system prompt, documents and the
separators between them, the prefix the backends cache — is byte for byte what the same order renders without
it; the line is part of the tail, computed anew with the question, and depends only on the two orders, so the
same reorder renders the same bytes. The retrieval order itself renders exactly as the client sent it (no line).
The line's tokens count in the estimated length of an order that adds it (:meth:`PromptPlan.tail_tokens_for`).

Segment keys: ``"p:" + hash`` of the prefix text (with roles), documents by their doc id. Token sizes are
estimated as UTF-8 bytes / ``chars_per_token`` (the tree only needs sizes that are consistent; the backend's
reported counts correct the tree's capacity).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from normalizer.documents import (
    DetectedDocuments,
    PromptDocuments,
    StructuredPrompt,
    content_id,
    message_text,
    render_document,
    reorder_spans,
)
from normalizer.responses import prompt_messages


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a prompt prefix: the system prompt or a document."""

    key: str
    tokens: int


EMPTY_PREFIX = Segment("p:", 0)
"""The prefix of a one-message plain prompt: nothing before the question (left out of every path)."""


def estimate_tokens(text: str, chars_per_token: float = 4.0) -> int:
    return max(1, math.ceil(len(text.encode("utf-8")) / chars_per_token)) if text else 0


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class PromptPlan:
    """The prefix structure of one request and a renderer for any order of its documents."""

    prefix: Segment
    documents: tuple[Segment, ...]
    """Retrieval order, best first."""
    tail_tokens: int
    """Estimated tokens after the documents in the retrieval order (the rank hint an other order adds excluded)."""
    _render: Callable[[Sequence[str]], list[Any]] | None = None
    """Renders the body's ``messages`` for an order of the documents; ``None`` when the body is forwarded as the
    client sent it (plus body hints), its documents in the order sent: a plain prompt, a Responses body."""
    _hint: Callable[[Sequence[str]], str] | None = None
    """The text :attr:`_render` adds for an order of the documents: its rank hint (``""`` for the retrieval
    order); ``None`` when nothing is rendered."""
    chars_per_token: float = 4.0

    @property
    def rewrites(self) -> bool:
        """Whether the body's messages are rendered anew (:meth:`render_messages`)."""
        return self._render is not None

    def tail_tokens_for(self, order: Sequence[Segment]) -> int:
        """Estimated tokens after the documents in ``order``: the tail, and the rank hint when ``order`` adds one."""
        if self._hint is None or not order:
            return self.tail_tokens
        return self.tail_tokens + estimate_tokens(self._hint([s.key for s in order]), self.chars_per_token)

    def total_tokens(self, order: Sequence[Segment]) -> int:
        """The prompt's estimated length with its documents in ``order`` (the rank hint it adds included)."""
        return self.prefix.tokens + sum(d.tokens for d in self.documents) + self.tail_tokens_for(order)

    def path(self, order: Sequence[Segment]) -> list[Segment]:
        """The tree path of ``order``: the prefix segment (left out when empty: a one-message plain prompt has
        nothing before its question to reuse), then the documents."""
        return [self.prefix, *order] if self.prefix.tokens else list(order)

    def render_messages(self, order: Sequence[Segment]) -> list[Any]:
        """The request's ``messages`` with the documents in ``order`` (a permutation of :attr:`documents`); the
        rest of the body is the client's."""
        assert self._render is not None, "a plan that does not rewrite has no messages to render"
        return self._render([s.key for s in order])


def moved_positions(retrieval: Sequence[str], order: Sequence[str]) -> list[int] | None:
    """For each retrieval rank (best first), the 1-based position its document takes in ``order`` (a permutation;
    repeated keys keep their relative order); ``None`` when ``order`` is the retrieval order."""
    if list(retrieval) == list(order):
        return None
    slots: dict[str, list[int]] = {}
    for position, key in enumerate(order, 1):
        slots.setdefault(key, []).append(position)
    return [slots[key].pop(0) for key in retrieval]


def rank_hint(noun: str, labels: Sequence[str]) -> str:
    """The line stating the retrieval order, best first, of the ``noun`` above (module docs)."""
    return f"Relevance order of the {noun} above, most relevant first: {', '.join(labels)}."


def _conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return "".join(f"\x1e{m.get('role', '')}\x1f{message_text(m)}" for m in messages)


def plan_request(
    body: Mapping[str, Any],
    prompt: PromptDocuments,
    *,
    chars_per_token: float = 4.0,
) -> PromptPlan | None:
    """The plan of a chat-completions body whose documents were read into ``prompt``, or ``None`` when it has no
    ``messages`` list."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    if prompt.structured is not None:
        return _structured_plan(prompt.structured, chars_per_token)
    if prompt.detected is not None:
        return _detected_plan(messages, prompt.detected, chars_per_token)
    prefix_text = _conversation_text(messages[:-1]) if len(messages) > 1 else ""
    tail_text = _conversation_text(messages[-1:])
    prefix = Segment("p:" + content_id(prefix_text), estimate_tokens(prefix_text, chars_per_token)) \
        if prefix_text else EMPTY_PREFIX
    return PromptPlan(prefix, (), estimate_tokens(tail_text, chars_per_token))


def plan_response(
    body: Mapping[str, Any],
    prompt: PromptDocuments,
    *,
    chars_per_token: float = 4.0,
) -> PromptPlan | None:
    """The plan of a Responses body whose documents were read from its chat view
    (:func:`normalizer.responses.read_response_prompt`): the chat view's segments, and no renderer: the body goes
    out as sent, its documents in the order sent."""
    plan = plan_request({"messages": prompt_messages(body)}, prompt, chars_per_token=chars_per_token)
    return None if plan is None else replace(plan, _render=None, _hint=None)


def _structured_plan(structured: StructuredPrompt, chars_per_token: float) -> PromptPlan:
    system, documents = structured.system, structured.documents
    by_key = {d.id: d for d in documents}
    segments = tuple(Segment(d.id, estimate_tokens(render_document(d), chars_per_token)) for d in documents)
    prefix = Segment(
        "p:" + content_id("\x1esystem\x1f" + system), estimate_tokens(system, chars_per_token) + 2
    )
    tail_tokens = estimate_tokens(_conversation_text(structured.messages), chars_per_token)
    retrieval = [d.id for d in documents]

    def hint(order: Sequence[str]) -> str:
        moved = moved_positions(retrieval, order)
        return "" if moved is None else rank_hint("documents", [order[p - 1] for p in moved]) + "\n"

    def render(order: Sequence[str]) -> list[Any]:
        messages = structured.render_messages([by_key[k] for k in order])
        line = hint(order)
        if line:  # after the last block: the system message ends with the documents' newline
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}{line}"}
        return messages

    return PromptPlan(prefix, segments, tail_tokens, render, hint, chars_per_token)


def _detected_plan(
    messages: list[Any],
    detected: DetectedDocuments,
    chars_per_token: float,
) -> PromptPlan:
    best_index, best_text, best_spans = detected.message, detected.text, detected.spans
    doc_message = messages[best_index]
    before = _conversation_text(messages[:best_index]) + f"\x1e{doc_message.get('role', '')}\x1f"
    prefix_text = before + best_text[: best_spans[0].start]
    prefix = Segment("p:" + content_id(prefix_text), estimate_tokens(prefix_text, chars_per_token))
    segments = [
        Segment(span.doc_id, estimate_tokens(best_text[span.start : span.end], chars_per_token))
        for span in best_spans
    ]
    separators = "".join(best_text[a.end : b.start] for a, b in itertools.pairwise(best_spans))
    tail_text = separators + best_text[best_spans[-1].end :] + _conversation_text(messages[best_index + 1 :])
    spans = list(best_spans)
    retrieval = [span.doc_id for span in spans]
    end = spans[-1].end

    def hint(order: Sequence[str]) -> str:
        moved = moved_positions(retrieval, order)
        return "" if moved is None else "\n" + rank_hint("passages", [str(p) for p in moved])

    def render(order: Sequence[str]) -> list[Any]:
        content = reorder_spans(best_text, spans, order)
        line = hint(order)
        if line:  # after the last document: the separators keep their places, so its end does too
            content = f"{content[:end]}{line}{content[end:]}"
        new_messages = list(messages)
        new_messages[best_index] = {**doc_message, "content": content}
        return new_messages

    return PromptPlan(
        prefix, tuple(segments), estimate_tokens(tail_text, chars_per_token), render, hint, chars_per_token
    )
