"""Context signatures: everything about a chat request that can change its answer, except the final question.

The semantic tier compares only the final user question by embedding; every other part of the request must be
*identical* for a semantic match to be allowed. :class:`ContextSignature` collects that other part from the
canonical request (:func:`normalizer.canonical.canonical_chat`, so every equivalence of the exact key applies)
and from the documents read out of the request (:class:`~normalizer.documents.PromptDocuments`, read once before
any cache tier), and hashes it into :attr:`ContextSignature.digest`, which the semantic index stores as a filter
next to each vector.

What is in it:

- ``model``;
- ``system``: the leading ``system``/``developer`` messages;
- ``tools``: ``tools``, ``tool_choice``, ``parallel_tool_calls`` and legacy ``functions``/``function_call``;
- ``history``: every message after the leading system messages and before the final user message;
- ``question_attachments``: the final user message without its text (its ``name``, images, audio, document
  parts), so "what is in this picture?" over two different pictures never matches;
- ``parameters``: everything else the exact key covers — ``temperature``, ``top_p``, ``seed``, ``max_tokens``,
  ``stop``, ``response_format``, penalties, ``logit_bias``, ``n``, reasoning effort, unknown fields... — compared
  exactly (two temperatures are two contexts: an answer sampled at 0.2 is not one sampled at 1.0);
- ``documents``: whether the request carries documents — sent apart (``ragproxy.documents``, ``document`` parts) or
  recognised in its text from earlier searches — and nothing else about them: which documents, in which order, are
  evidence, not identity (:mod:`normalizer.evidence`: a match needs the new prompt to carry what the cached answer
  rests on). The documents are cut out of the messages the other fields hold (``document`` parts dropped, recognised
  documents cut out of their message's text), so two paraphrases that retrieved different documents share a
  signature, and a question asked with documents never shares one with a question asked without;
- ``knowledge_version``: the knowledge version the answer was produced under;
- ``variant``: what besides the body the upstream may answer by — the query string and the keyed headers
  (:func:`normalizer.canonical.request_variant`), as the exact key covers them.

When recognised documents sit inside the final user message, the question compared by embedding is that message's
text with the documents cut out (:func:`final_question`): their text is in ``documents``, and left in the
question it would drown the question itself.

Digest: hex BLAKE2b-256 of the canonical JSON of ``{"format": "sig4", ...all fields above}`` (``sig3`` held the
documents themselves, in order; ``sig2`` did not cover the variant).

Responses API requests (:func:`response_signature`, format ``rsig2``, so never equal to a chat signature): the
same fields from :func:`normalizer.responses.canonical_response` — ``system`` is ``instructions`` with the leading
system/developer input items, ``history`` the input items before the final one, which must be a user message
(:func:`normalizer.responses.final_input_question`); ``parameters`` everything else the exact key covers
(``text``, ``reasoning``, ``include``, ``max_output_tokens``, ``previous_response_id``, sampling...), and the
documents themselves as ``[id, BLAKE2b of the text, title]`` in the client's order (input items are not cut out
yet, so a Responses question still needs the very same documents). Stored
requests have no question for the semantic stage (:func:`normalizer.responses.semantic_question`): only exact
repeats answer them. :class:`PromptReading` names the
question and signature functions of each endpoint for the semantic stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from normalizer.canonical import canonical_chat
from normalizer.canonical_json import JSONValue, digest_hex, encode_canonical
from normalizer.documents import (
    DOCUMENT_PART_TYPE,
    NO_DOCUMENTS,
    TEXT_PARTS,
    PromptDocuments,
    content_id,
    message_text,
)
from normalizer.responses import (
    canonical_response,
    final_input_question,
    prompt_messages,
    semantic_question,
    split_prompt,
)

SIGNATURE_FORMAT = "sig4"
RESPONSE_SIGNATURE_FORMAT = "rsig2"

_SYSTEM_ROLES = frozenset({"system", "developer"})
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


@dataclass(frozen=True, slots=True)
class ContextSignature:
    """The context a final question was asked in; two questions may match only under equal digests."""

    model: str
    system: JSONValue
    tools: JSONValue
    history: JSONValue
    question_attachments: JSONValue
    parameters: JSONValue
    documents: JSONValue
    knowledge_version: str
    variant: JSONValue
    digest: str


def final_question(body: Mapping[str, Any], prompt: PromptDocuments = NO_DOCUMENTS) -> str | None:
    """The text of the last message when it is from the user (text parts joined by newlines; recognised documents
    cut out), else ``None`` — also when the body has no messages or the last user message carries no text."""
    messages = body.get("messages") if isinstance(body, Mapping) else None
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    detected = prompt.detected
    if detected is not None and detected.message == len(messages) - 1:
        return detected.without_documents() or None
    return message_text(last) or None


def _attachments(message: Mapping[str, JSONValue]) -> JSONValue:
    rest = {key: value for key, value in message.items() if key not in ("role", "content")}
    content = message.get("content")
    if isinstance(content, list):
        non_text = [part for part in content if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS)]
        if non_text:
            rest["content"] = non_text
    return rest


def _documents(prompt: PromptDocuments) -> JSONValue:
    return [[document.id, content_id(document.text), document.title] for document in prompt.documents]


def _cut_documents(messages: list[dict[str, JSONValue]], prompt: PromptDocuments) -> list[dict[str, JSONValue]]:
    """Canonical ``messages`` without the documents ``prompt`` read from them: ``document`` parts dropped, the
    recognised documents cut out of their message's text."""
    if prompt.structured is not None:
        return [{**message, "content": [part for part in content if not (
                    isinstance(part, dict) and part.get("type") == DOCUMENT_PART_TYPE)]}
                if isinstance(content := message.get("content"), list) else message for message in messages]
    detected = prompt.detected
    if detected is None:
        return messages
    cut = list(messages)
    cut[detected.message] = {**cut[detected.message],
                             "content": [{"type": "text", "text": detected.without_documents()}]}
    return cut


def context_signature(
    body: Mapping[str, Any],
    *,
    prompt: PromptDocuments = NO_DOCUMENTS,
    knowledge_version: str = "0",
    variant: JSONValue = None,
) -> ContextSignature | None:
    """The signature of a chat request whose documents were read into ``prompt``, or ``None`` when its last message
    is not a user question.

    Raises :class:`normalizer.canonical_json.CanonicalizationError` when the body is malformed.
    """
    if final_question(body, prompt) is None:
        return None
    canonical = canonical_chat(body)
    messages = _cut_documents(list(canonical["messages"]), prompt)
    final = messages.pop()
    leading = 0
    while leading < len(messages) and messages[leading]["role"] in _SYSTEM_ROLES:
        leading += 1
    return _signed(SIGNATURE_FORMAT, canonical, {"model", "messages"}, messages[:leading], messages[leading:],
                   final, bool(prompt.documents), knowledge_version, variant)


def response_signature(
    body: Mapping[str, Any],
    *,
    prompt: PromptDocuments = NO_DOCUMENTS,
    knowledge_version: str = "0",
    variant: JSONValue = None,
) -> ContextSignature | None:
    """The signature of a Responses API request (see the module docstring), or ``None`` when its last input item
    is not a user question. Raises :class:`~normalizer.canonical_json.CanonicalizationError` when malformed."""
    if final_input_question(body, prompt) is None:
        return None
    canonical = canonical_response(body)
    system, history, final = split_prompt(canonical)
    return _signed(RESPONSE_SIGNATURE_FORMAT, canonical, {"model", "input", "instructions"}, system, history, final,
                   _documents(prompt), knowledge_version, variant)


def _signed(signature_format: str, canonical: Mapping[str, JSONValue], consumed: set[str], system: JSONValue,
            history: JSONValue, final: Mapping[str, JSONValue], documents: JSONValue,
            knowledge_version: str, variant: JSONValue) -> ContextSignature:
    tools = {field: canonical[field] for field in _TOOL_FIELDS if field in canonical}
    parameters = {key: value for key, value in canonical.items() if key not in consumed and key not in tools}
    fields: dict[str, JSONValue] = {
        "format": signature_format,
        "model": canonical["model"],
        "system": system,
        "tools": tools,
        "history": history,
        "question_attachments": _attachments(final),
        "parameters": parameters,
        "documents": documents,
        "knowledge_version": knowledge_version,
        "variant": variant,
    }
    return ContextSignature(
        model=canonical["model"],
        system=system,
        tools=tools,
        history=history,
        question_attachments=fields["question_attachments"],
        parameters=parameters,
        documents=fields["documents"],
        knowledge_version=knowledge_version,
        variant=variant,
        digest=digest_hex(encode_canonical(fields)),
    )


def _told(messages: list[Any], prompt: PromptDocuments) -> str:
    """The text of every message but the final one, recognised documents cut out of the message holding them."""
    detected = prompt.detected
    texts = [detected.without_documents() if detected is not None and detected.message == i else message_text(m)
             for i, m in enumerate(messages[:-1]) if isinstance(m, Mapping)]
    return "\n".join(text for text in texts if text)


def chat_instructions(body: Mapping[str, Any], prompt: PromptDocuments = NO_DOCUMENTS) -> str:
    """What a chat request tells the model besides its final question: the system prompt and the earlier turns
    (documents cut out: they are material, not instructions)."""
    messages = body.get("messages")
    return _told(messages if isinstance(messages, list) else [], prompt)


def response_instructions(body: Mapping[str, Any], prompt: PromptDocuments = NO_DOCUMENTS) -> str:
    """What a Responses request tells the model besides its final input item: its ``instructions`` and earlier
    items (documents cut out)."""
    return _told(prompt_messages(body), prompt)


@dataclass(frozen=True, slots=True)
class PromptReading:
    """How the semantic stage reads one endpoint's body: its final question, its context signature, and what else it
    tells the model."""

    question: Callable[[Mapping[str, Any], PromptDocuments], str | None]
    signature: Callable[[Mapping[str, Any], PromptDocuments, str, JSONValue], ContextSignature | None]
    """``(body, prompt, knowledge version, variant)`` → the signature."""
    instructions: Callable[[Mapping[str, Any], PromptDocuments], str]
    """The prompt's text but its final question (an answer's words found there were dictated, not found:
    :func:`tiers.answer_check.informative_words`)."""


CHAT_READING = PromptReading(
    final_question, lambda body, prompt, version, variant: context_signature(
        body, prompt=prompt, knowledge_version=version, variant=variant), chat_instructions)
RESPONSE_READING = PromptReading(
    semantic_question, lambda body, prompt, version, variant: response_signature(
        body, prompt=prompt, knowledge_version=version, variant=variant), response_instructions)
