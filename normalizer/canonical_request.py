"""The canonicalisers of the endpoints whose final question is folded (legacy Completions keys
:func:`normalizer.canonical.canonical_completion`): an endpoint row names its own.

Apart from :mod:`normalizer.canonical` because the Responses API's canonical form (:mod:`normalizer.responses`)
builds on that module's helpers: the functions that need both sit above them, so imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from normalizer.canonical import canonical_chat, fold_final_question
from normalizer.canonical_json import JSONValue
from normalizer.responses import canonical_response

Canonicaliser = Callable[[Mapping[str, Any]], dict[str, JSONValue]]
"""A body → its canonical request (:class:`~normalizer.canonical_json.CanonicalizationError` when it has none)."""


def chat_request(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """A Chat Completions request, its final user question folded
    (:func:`~normalizer.canonical.fold_final_question`)."""
    canonical = canonical_chat(body)
    fold_final_question(canonical["messages"], "text")
    return canonical


def response_request(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """A Responses API request, its final user input folded."""
    canonical = canonical_response(body)
    fold_final_question(canonical["input"], "input_text")
    return canonical
