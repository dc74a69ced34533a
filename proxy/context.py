"""What travels through the pipeline: the per-request context, and the reply the stages hand back.

:class:`Reply` (and its callbacks) is defined in :mod:`proxy.reply` and is part of the vocabulary stages import from
here; the values the stages hand on through the context's slots are defined in :mod:`proxy.slots`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import orjson

from proxy.errors import ProxyError
from proxy.outcome import CacheStatus
from proxy.reply import EndCallback, FinishCallback, Reply
from proxy.server.request import Request

if TYPE_CHECKING:
    from normalizer.cache_control import CachePolicy
    from normalizer.canonical import KeyScope
    from normalizer.documents import PromptDocuments
    from proxy.credits.store import Reservation
    from proxy.slots import RequestTrace, RerankCount, RoutedRequest, SemanticQuery, ShapedRequest
    from proxy.upstream.backends import Backend
    from tiers.entry import CachedResponse

__all__ = ["SLOTS", "EndCallback", "FinishCallback", "Reply", "RequestContext"]


@dataclass(slots=True)
class RequestContext:
    """Everything the stages know about one data-plane request.

    Stages hand results to later stages through these typed slots, each set by the one stage named next to it
    (a stage declares the slots it reads and sets in ``needs``/``gives``; :class:`~proxy.pipeline.Pipeline` checks
    at assembly that every slot a stage needs is set by an earlier one). ``None`` means "not decided for this
    request" (the stage is not in the pipeline, or did not apply).
    """

    # the route handler (proxy.routes.handler): the parsed request
    request: Request
    route: str
    request_id: str
    raw_body: bytes = b""
    body: dict[str, Any] | None = None
    proxy_fields: Mapping[str, Any] = field(default_factory=dict)
    """The proxy's own body objects (``cache``, ``ragproxy``), lifted out of ``body`` before anything else."""
    upstream_path: str = ""
    method: str = "POST"
    stream: bool = False
    body_changed: bool = False
    # identify
    tenant: str = "anonymous"
    user: str = "anonymous"
    api_key_id: str | None = None
    # stored_responses
    pinned: int | None = None
    """The LLM replica (index) that keeps the stored response this request names: forward sends it there only."""
    # credits
    reservation: Reservation | None = None
    """The billing reservation held for this request (the upstream is then asked to report its usage)."""
    # cache_control
    cache_policy: CachePolicy | None = None
    namespace: str = "default"
    # prompt
    prompt: PromptDocuments | None = None
    """The documents the prompt carries, read once before any cache tier."""
    # canonicalize (user_scope and key_scope also by the embeddings items cache)
    user_scope: str | None = None
    """The user digest when the request's answers are user-scoped (private), set even when it is not cached."""
    key_scope: KeyScope | None = None
    key_variant: Any = None
    """What besides the body the upstream may answer by (query string, keyed headers): in the key and signature."""
    cache_key: str | None = None
    bypass_reason: str | None = None
    # l2
    semantic: SemanticQuery | None = None
    # rerank_items
    rerank: RerankCount | None = None
    """How many of a reranker request's documents the upstream scored and how many came from the cache."""
    # coalesce
    follower: bool = False
    """The request waited on another's identical upstream call: its answer is not stored a second time."""
    # shape
    shape: ShapedRequest | None = None
    # route
    routed: RoutedRequest | None = None
    reported_cached_tokens: int | None = None
    """Prompt tokens the backend reported as reused from its KV cache (read on the way back)."""
    # forward
    upstream_called: bool = False
    """The request was sent to an upstream, which may have started working on it."""
    backend: Backend | None = None
    upstream_seconds: float | None = None
    # the outcome (proxy.outcome): set by the stage that decided it, read on the way back
    cache_status: CacheStatus | None = None
    """How the cache took part (``None``: no cache stage decided anything)."""
    cache_tier: str | None = None
    """The tier that answered (``None``: the upstream did)."""
    charged: int | None = None
    """Micro-credits charged, when settled with the reply (``X-Credits-Charged``; a stream settles later)."""
    entry: CachedResponse | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    # tracing (proxy.tracing), when on
    trace: RequestTrace | None = None

    def replace_body(self, body: dict[str, Any]) -> None:
        """Send ``body`` upstream instead of the client's bytes."""
        self.body = body
        self.body_changed = True

    def outgoing_body(self) -> bytes:
        """The bytes to forward: the client's own unless a stage reshaped the body."""
        if self.body_changed and self.body is not None:
            try:
                return orjson.dumps(self.body)
            except TypeError:  # orjson encodes at most 255 levels of nesting (it decodes 1024)
                message = "the request body nests too deeply to be forwarded"
                raise ProxyError(400, message, code="invalid_json") from None
        return self.raw_body


SLOTS = frozenset(f.name for f in fields(RequestContext))
"""The names of the context's slots (what stages may declare in ``needs``/``gives``)."""
