"""Context signatures: everything about a chat request except the final user question.

The semantic tier compares only the final user question by embedding; every other part of the request must
be *identical* for a semantic match to be allowed. :class:`ContextSignature` collects that other part from
the canonical request (:func:`normalizer.canonical.canonical_chat`, so every equivalence of the exact key
applies) and hashes it into :attr:`ContextSignature.digest`, which the semantic index stores as a filter
next to each vector.

What is in it:

- ``model``;
- ``system``: the leading ``system``/``developer`` messages;
- ``tools``: ``tools``, ``tool_choice``, ``parallel_tool_calls`` and legacy ``functions``/``function_call``;
- ``sampling_class``: ``"greedy"`` when temperature is 0, else ``"sampled"``. Exact temperature, ``top_p``
  and ``seed`` are deliberately left out: two sampled requests for the same question may share an answer the
  way two runs of one request may. A greedy request never matches a sampled one;
- ``history``: every message after the leading system messages and before the final user message;
- ``question_attachments``: the final user message without its text (its ``name``, images, audio), so "what
  is in this picture?" over two different pictures never matches;
- ``parameters``: everything else in the canonical request (``max_tokens``, ``stop``, ``response_format``,
  penalties, ``logit_bias``, ``n``, reasoning effort, unknown fields...), compared exactly;
- ``document_ids``: the set of retrieved documents the prompt carries, when the caller knows it (sorted;
  ``None`` — unknown — is different from an empty set);
- ``knowledge_version``: the knowledge version the answer was produced under.

Digest: hex BLAKE2b-256 of the canonical JSON of ``{"format": "sig1", ...all fields above}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from normalizer.canonical import canonical_chat
from normalizer.canonical_json import JSONValue, digest_hex, encode_canonical

SamplingClass = Literal["greedy", "sampled"]
SIGNATURE_FORMAT = "sig1"

_SYSTEM_ROLES = frozenset({"system", "developer"})
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
_SAMPLING_FIELDS = ("temperature", "top_p", "seed")


@dataclass(frozen=True, slots=True)
class ContextSignature:
    """The context a final question was asked in; two questions may match only under equal digests."""

    model: str
    system: JSONValue
    tools: JSONValue
    sampling_class: SamplingClass
    history: JSONValue
    question_attachments: JSONValue
    parameters: JSONValue
    document_ids: tuple[str, ...] | None
    knowledge_version: str
    digest: str


def _message_text(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts) if texts else None
    return None


def final_question(body: Mapping[str, Any]) -> str | None:
    """The text of the last message when it is from the user (text parts joined by newlines), else ``None``.

    ``None`` also when the body has no messages or the last user message carries no text at all.
    """
    messages = body.get("messages") if isinstance(body, Mapping) else None
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    return _message_text(last)


def _sampling_class(canonical: Mapping[str, Any]) -> SamplingClass:
    return "greedy" if canonical.get("temperature") == 0 else "sampled"


def _attachments(message: Mapping[str, JSONValue]) -> JSONValue:
    rest = {key: value for key, value in message.items() if key not in ("role", "content")}
    content = message.get("content")
    if isinstance(content, list):
        non_text = [part for part in content if not (isinstance(part, dict) and part.get("type") == "text")]
        if non_text:
            rest["content"] = non_text
    return rest


def context_signature(
    body: Mapping[str, Any],
    *,
    document_ids: Iterable[str] | None = None,
    knowledge_version: str = "0",
) -> ContextSignature | None:
    """The signature of a chat request, or ``None`` when its last message is not a user question.

    Raises :class:`normalizer.canonical_json.CanonicalizationError` when the body is malformed.
    """
    if final_question(body) is None:
        return None
    canonical = canonical_chat(body)
    messages: list[dict[str, JSONValue]] = list(canonical["messages"])
    final = messages.pop()
    leading = 0
    while leading < len(messages) and messages[leading]["role"] in _SYSTEM_ROLES:
        leading += 1
    tools = {field: canonical[field] for field in _TOOL_FIELDS if field in canonical}
    consumed = {"model", "messages", *_TOOL_FIELDS, *_SAMPLING_FIELDS}
    parameters = {key: value for key, value in canonical.items() if key not in consumed}
    ids = tuple(sorted(set(document_ids))) if document_ids is not None else None
    fields: dict[str, JSONValue] = {
        "format": SIGNATURE_FORMAT,
        "model": canonical["model"],
        "system": messages[:leading],
        "tools": tools,
        "sampling_class": _sampling_class(canonical),
        "history": messages[leading:],
        "question_attachments": _attachments(final),
        "parameters": parameters,
        "document_ids": list(ids) if ids is not None else None,
        "knowledge_version": knowledge_version,
    }
    return ContextSignature(
        model=canonical["model"],
        system=fields["system"],
        tools=tools,
        sampling_class=fields["sampling_class"],
        history=fields["history"],
        question_attachments=fields["question_attachments"],
        parameters=parameters,
        document_ids=ids,
        knowledge_version=knowledge_version,
        digest=digest_hex(encode_canonical(fields)),
    )
