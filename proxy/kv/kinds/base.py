"""What an adapter of a backend kind says: the hints a request carries to it, whether the proxy tracks its slots,
where its health is probed, and how its report of reused prompt tokens is read."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normalizer.prompt_plan import Segment
from proxy.kv.hints import (
    Hints,
    Reported,
    path_hash,
    prefix_docs_header,
    reported_cached_tokens,
    reported_decode_s,
    reported_prefill,
    reported_prompt_tokens,
)


def tenant_salt(tenant: str, secret: str = "") -> str:
    return hashlib.blake2b(f"{secret}\x1f{tenant}".encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class HintRequest:
    """What a body hint may depend on: the prefix (its path hash; ``None`` for a prompt with nothing before its
    question), the cache scope (tenant, or tenant and user), the chunk-reuse threshold, and whether the body is a
    Responses one (``/v1/responses``)."""

    path_digest: str | None
    tenant: str
    salt_secret: str = ""
    shift_min_tokens: int = 0
    responses: bool = False


@dataclass(frozen=True, slots=True)
class BackendReport:
    """What the backend said it did: prompt tokens reused, the prompt's length, llama.cpp's prefill and decode
    figures."""

    cached_tokens: int | None
    prompt_tokens: int | None
    prefill: tuple[int, int, float] | None
    decode_s: float | None = None
    """Time spent generating after the first token (llama.cpp's ``timings.predicted_ms``)."""


class BackendKind:
    """An OpenAI-compatible server that takes no hints in the body (``generic``); other kinds override."""

    name = "generic"
    tracks_slots = False
    """Whether the server keeps one prompt per slot that the proxy follows (``id_slot``, ``GET /slots``, reuse of
    cached chunks outside the prefix)."""

    def body_hints(self, request: HintRequest) -> Mapping[str, Any]:
        """Fields merged into the upstream JSON body."""
        return {}

    def slot_hint(self, slot: int) -> Mapping[str, Any]:
        """Fields that pin a request to the server's ``slot``, added as it starts (only kinds that track slots)."""
        return {}

    def report(self, reply: Reported) -> BackendReport:
        """The reused prompt tokens, the prompt's length and the prefill figures the reply reports (OpenAI's
        ``usage`` or llama.cpp's ``timings``: read whichever the reply carries)."""
        return BackendReport(reported_cached_tokens(reply), reported_prompt_tokens(reply), reported_prefill(reply),
                             reported_decode_s(reply))

    def __repr__(self) -> str:
        return f"<backend kind {self.name}>"


def build_hints(
    kind: BackendKind,
    path: Sequence[Segment],
    *,
    document_keys: Sequence[str] = (),
    tenant: str = "anonymous",
    salt_secret: str = "",
    shift_min_tokens: int = 0,
    responses: bool = False,
) -> Hints:
    """Hints for a request whose prompt prefix is ``path`` (system prompt segment, then documents): the kind's body
    fields and, when there is a prefix, the ``X-Prefix-*`` headers.

    An empty ``path`` (a single message, nothing before it) has no prefix to name: no ``X-Prefix-*`` headers, no
    ``prompt_cache_key``. Isolation (``cache_salt``) and llama.cpp's ``cache_prompt`` still apply. ``shift_min_tokens``
    > 0 lets a llama.cpp server also reuse cached runs of at least that many tokens outside the common prefix.
    ``responses``: the body goes to ``/v1/responses`` (:mod:`proxy.kv.hints` says what each kind gets there)."""
    digest = path_hash([s.key for s in path]) if path else None
    body = dict(kind.body_hints(HintRequest(digest, tenant, salt_secret, shift_min_tokens, responses)))
    if digest is None:
        return Hints(body=body)
    headers = {"X-Prefix-Hash": digest}
    docs = prefix_docs_header(document_keys)
    if docs:
        headers["X-Prefix-Docs"] = docs
    return Hints(body=body, headers=headers)
