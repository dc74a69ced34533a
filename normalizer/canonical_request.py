"""The canonical request(s) of every kind, in one call.

Apart from :mod:`normalizer.canonical` because the Responses API's canonical form (:mod:`normalizer.responses`)
builds on that module's helpers: the one function that needs both sits above them, so imports run one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from normalizer.canonical import (
    RequestKind,
    canonical_chat,
    canonical_completion,
    canonical_embedding_items,
    fold_final_question,
)
from normalizer.canonical_json import JSONValue
from normalizer.responses import canonical_response


def canonical_request(kind: RequestKind, body: Mapping[str, Any]) -> list[dict[str, JSONValue]]:
    """Canonical requests for ``kind``: one for chat/completion/response, one per input item for embeddings. The final
    user question of a chat or Responses request is folded (:func:`~normalizer.canonical.fold_final_question`)."""
    if kind == "chat":
        canonical = canonical_chat(body)
        fold_final_question(canonical["messages"], "text")
        return [canonical]
    if kind == "completion":
        return [canonical_completion(body)]
    if kind == "response":
        canonical = canonical_response(body)
        fold_final_question(canonical["input"], "input_text")
        return [canonical]
    return canonical_embedding_items(body)
