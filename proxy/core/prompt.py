"""The documents a chat prompt carries, read once before any cache tier.

``ReadPrompt`` sets ``ctx.prompt`` (:func:`normalizer.documents.read_prompt`): documents sent apart from the prompt
(``ragproxy.documents``, lifted out of the body by the route handler, or ``document`` content parts), else
documents recognised in the prompt's text: pasted in a recognisable shape (numbered, tagged or delimited blocks),
returned by earlier Qdrant searches, or blank-line paragraphs that moved between requests (each long message is
observed here first, :mod:`normalizer.repeated_blocks`). The exact key, the semantic tier's
context signature and the KV stages all read this one result. A malformed document is a 400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from normalizer.documents import DocumentRegistry, PromptDocuments, read_prompt
from normalizer.repeated_blocks import RepeatedBlocks
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Next

PromptReader = Callable[[Mapping[str, Any], Any, DocumentRegistry | None, RepeatedBlocks | None], PromptDocuments]
"""Reads a body's documents (``read_prompt`` for chat, ``normalizer.responses.read_response_prompt``)."""


class ReadPrompt:
    """``ctx.prompt``: the prompt's documents (structured, recognised, or none)."""

    name = "prompt"
    needs: frozenset[str] = frozenset()
    gives = frozenset({"prompt"})

    def __init__(self, registry: DocumentRegistry | None, read: PromptReader = read_prompt,
                 repeated: RepeatedBlocks | None = None) -> None:
        self.registry = registry
        self.read = read
        self.repeated = repeated

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        own = ctx.proxy_fields.get("ragproxy")
        documents = own.get("documents") if isinstance(own, dict) else None  # parsed JSON: an object is a dict
        try:
            ctx.prompt = self.read(ctx.body or {}, documents, self.registry, self.repeated)
        except ValueError as error:
            raise ProxyError(400, str(error), param="ragproxy.documents") from error
        return await call_next(ctx)
