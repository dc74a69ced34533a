"""What travels through the pipeline: the per-request context and the reply the stages hand back.

A :class:`Reply` is either complete (``body``) or streamed (``chunks``). Stages that need the whole body once the
client has it (store in a tier, settle credits) register a callback with :meth:`Reply.on_finish`; the route calls
:meth:`Reply.finish` after the last byte was written, with ``ok=False`` when the stream was aborted (client gone,
upstream reset), so nothing half-received is ever stored or billed as complete.

Work that needs neither the body nor any I/O (giving back a backend's in-flight count, timing the upstream) is
registered with :meth:`Reply.on_end` instead: a plain function, run inline when the transfer ends, before the
finish callbacks. A reply with only such work is sent without collecting its stream and without the task that
protects finish callbacks from a client hanging up (two event-loop turns per request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import orjson
from multidict import CIMultiDict

from proxy.errors import ProxyError
from proxy.server.request import Request

if TYPE_CHECKING:
    from normalizer.cache_control import CachePolicy
    from normalizer.canonical import KeyScope
    from normalizer.documents import PromptDocuments
    from proxy.credits.store import Reservation
    from proxy.kv.stages import RoutedRequest, ShapedRequest
    from proxy.stages.rerank import RerankCount
    from proxy.stages.semantic import SemanticQuery
    from proxy.tracing import RequestTrace
    from proxy.upstream.backends import Backend
    from tiers.entry import CachedResponse

FinishCallback = Callable[["Reply", bool, bytes], Awaitable[None]]
EndCallback = Callable[["Reply", bool], None]


@dataclass(slots=True)
class Reply:
    """A response on its way to the client."""

    status: int
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytes | None = None
    chunks: AsyncIterator[bytes] | None = None
    _callbacks: list[FinishCallback] = field(default_factory=list)
    _enders: list[EndCallback] = field(default_factory=list)

    @property
    def streamed(self) -> bool:
        return self.chunks is not None

    @property
    def wants_body(self) -> bool:
        """Whether someone needs the full body at the end (so a stream must be collected while it passes)."""
        return bool(self._callbacks)

    def on_finish(self, callback: FinishCallback) -> None:
        """Call ``callback(reply, ok, body)`` once the client has received everything (or the transfer failed)."""
        self._callbacks.append(callback)

    def on_end(self, callback: EndCallback) -> None:
        """Call ``callback(reply, ok)`` inline once the transfer ended (before the finish callbacks)."""
        self._enders.append(callback)

    def take_over(self, replaced: Reply) -> Reply:
        """This reply answers instead of ``replaced``: its finish work (releasing a replica, settling) moves here."""
        self._callbacks[:0] = replaced._callbacks
        self._enders[:0] = replaced._enders
        replaced._callbacks = []
        replaced._enders = []
        return self

    def end(self, ok: bool) -> None:
        """Run the end callbacks (once), in the order they were registered."""
        enders, self._enders = self._enders, []
        for callback in enders:
            callback(self, ok)

    async def finish(self, ok: bool, body: bytes) -> None:
        """Run the end callbacks, then the finish callbacks, innermost stage first (the order they were
        registered in)."""
        self.end(ok)
        for callback in self._callbacks:
            await callback(self, ok, body)


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
    # the outcome: set by the tier that answered, or by store for a new entry
    cache_status: str | None = None
    cache_tier: str | None = None
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
