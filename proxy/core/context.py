"""What travels through the pipeline: the per-request context, and the reply the stages hand back.

:class:`Reply` (and its callbacks) is defined in :mod:`proxy.core.reply` and is part of the vocabulary stages import
from
here; the values the stages hand on through the context's slots are defined in :mod:`proxy.core.handoffs`.

What one feature hands to later stages is not a slot: it is a :class:`Handoff`, a typed key declared in the module of
the stage that gives it (``ctx.handoffs[KEY] = value``, ``ctx.handoffs.get(KEY)``), so a feature adds one without
editing the core.

The way in and the way up are kept apart. ``ctx.body`` is the client's JSON body as the route handler parsed it
(less the proxy's own fields, ``ctx.proxy_fields``) and stays so for the whole request: it is ``Final`` (never
reassigned) and a ``Mapping`` (never changed in place), so every stage — cache keys, limits, credits, the tiers on
the way back — reads what the client asked, whatever was changed for the upstream. What goes upstream is that body
plus an ordered list of named :class:`Patch` es (``ctx.patch(name, apply)``: the per-item caches asking for the
missing items only, the KV layer's document order and hints, credits asking a stream for its usage).
:meth:`RequestContext.outgoing_json` applies them in order; :meth:`RequestContext.outgoing_body` serialises that
once, and with no patch (and nothing lifted out) sends ``written_body``: the body as the strict parser read it,
serialised again by the route handler. The client's bytes (``raw_body``) never go upstream. Besides the forward stages,
only credits read the upstream-bound body: what the upstream did is estimated from what it was sent, and a search
batch is charged for the searches sent. The patch names are the ``ragproxy.body_patches`` attribute of the
request's spans (:mod:`proxy.core.tracing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, Protocol, TypeVar, cast

import orjson

from proxy.core.errors import ProxyError
from proxy.core.outcome import Outcome
from proxy.core.reply import EndCallback, FinishCallback, Reply
from proxy.server.request import Request

if TYPE_CHECKING:
    from normalizer.cache_control import CachePolicy
    from normalizer.canonical import KeyScope
    from normalizer.documents import PromptDocuments
    from proxy.core.handoffs import RequestTrace
    from tiers.entry import CachedResponse

__all__ = ["SLOTS", "EndCallback", "FinishCallback", "Handoff", "Patch", "Reply", "RequestContext"]

T = TypeVar("T")

Rewrite = Callable[[Mapping[str, Any]], dict[str, Any]]
"""The body as patched so far in, the next one out: a new dict (the argument is never changed) that keeps every
field it does not mean to change, what earlier patches did included."""


class Patch(NamedTuple):
    """One named change to the body sent upstream: ``name`` says what changed and which stage changed it
    (``"<stage>.<what>"``, shown in the request's trace); ``apply`` makes the change."""

    name: str
    apply: Rewrite


class Handoff(Generic[T]):
    """A typed key for a value one stage hands to later ones, kept apart from the context's slots.

    Declared once, in the module of the stage that gives it (``SHAPED: Handoff[ShapedRequest] = Handoff("shape")``),
    or, when a reader cannot import that module (a lower layer, or a folder that the giver's folder imports), in
    the reader's. The giver names the key in ``gives`` and sets ``ctx.handoffs[KEY] = value``; readers name it in
    ``needs`` (or ``reads`` / ``reads_if_given``) and read ``ctx.handoffs.get(KEY)``, ``None`` when not given. Keys
    are compared by identity: two keys never clash, whatever their names (``name`` is for messages).
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Handoff({self.name!r})"


class Handoffs(Protocol):
    """The features' handoffs of one request, by key: a plain ``dict`` (its own ``get`` and item assignment, so a
    handoff costs a dict operation and no call of ours), typed by key."""

    def get(self, key: Handoff[T], /) -> T | None: ...

    def __setitem__(self, key: Handoff[T], value: T, /) -> None: ...

    def __contains__(self, key: object, /) -> bool: ...


_new_handoffs = cast("Callable[[], Handoffs]", dict)
"""A request's handoffs start as an empty plain dict (mypy cannot match ``dict``'s overloads to the keyed ones)."""


@dataclass(slots=True)
class RequestContext:
    """Everything the stages know about one data-plane request.

    The slots hold what every request carries: what the route handler parsed, who is asking, the cache key and
    scope, what the forward stage did and the upstream reported, and the outcome; each is set by the stage named
    next to it (a stage declares the slots it reads and sets in ``needs``/``gives``;
    :class:`~proxy.core.pipeline.Pipeline` checks at assembly that every slot a stage needs is set by an earlier one).
    ``None`` means "not decided for this request" (the stage is not in the pipeline, or did not apply). What one
    feature hands to others is a :class:`Handoff` in ``handoffs``, declared and checked the same way.
    """

    # the route handler (proxy.assembly.routes.handler): the parsed request
    request: Request
    route: str
    request_id: str
    raw_body: bytes = b""
    """The body as the client sent it: what limits and estimates measure, never what goes upstream."""
    body: Final[Mapping[str, Any] | None] = None
    """The client's JSON body, never reassigned nor changed (see the module docstring); what goes upstream is
    :meth:`outgoing_json`."""
    proxy_fields: Mapping[str, Any] = field(default_factory=dict)
    """The proxy's own body objects (``cache``, ``ragproxy``), lifted out of ``body`` before anything else."""
    written_body: bytes | None = None
    """``body`` as parsed (before the proxy's fields were lifted), serialised again: forwarded when nothing changed
    it (:meth:`outgoing_body`; ``None``: not written yet, ``body`` is serialised when it is forwarded)."""
    upstream_path: str = ""
    """The upstream's path and query, built from the route's row (:func:`normalizer.paths.upstream_target`)."""
    path_params: Mapping[str, str] = field(default_factory=dict)
    """The typed parameters of the row's path template (a stored response's id)."""
    method: str = "POST"
    stream: bool = False
    patches: tuple[Patch, ...] = ()
    """The changes to ``body`` for the upstream, in the order they apply (added by :meth:`patch`)."""
    # identify
    tenant: str = "anonymous"
    user: str = "anonymous"
    api_key_id: str | None = None
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
    # forward
    upstream_called: bool = False
    """The request was sent to an upstream, which may have started working on it."""
    replica: str | None = None
    """The label of the LLM replica that answered (what metrics, logs and stored-response owners name it by)."""
    upstream_seconds: float | None = None
    reported_cached_tokens: int | None = None
    """Prompt tokens the upstream reported as reused from its KV cache (read by route on the way back, which sets
    it; the observers count it for every request)."""
    # the outcome (proxy.core.outcome): set by the stage that decided it, read on the way back
    outcome: Outcome | None = None
    """What the cache did: status, tier and how it matched (``None``: no cache stage decided anything)."""
    charged: int | None = None
    """Micro-credits charged, when settled with the reply (``X-Credits-Charged``; a stream settles later)."""
    entry: CachedResponse | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    # tracing (proxy.core.tracing), when on
    trace: RequestTrace | None = None
    # the features' handoffs (:class:`Handoff`), each given by one stage
    handoffs: Handoffs = field(default_factory=_new_handoffs)
    """What features hand to later stages: ``handoffs[KEY] = value``, ``handoffs.get(KEY)`` (``None``: not given)."""

    def patch(self, name: str, apply: Rewrite) -> None:
        """Change the body sent upstream with ``apply``, after the patches already made; ``ctx.body`` stays the
        client's."""
        self.patches = (*self.patches, Patch(name, apply))

    def outgoing_json(self) -> Mapping[str, Any] | None:
        """The JSON body the upstream gets: ``body`` with every patch applied in order (``body`` itself when
        there is none)."""
        if not self.patches:
            return self.body
        body: Mapping[str, Any] = self.body if self.body is not None else {}
        for patch in self.patches:
            body = patch.apply(body)
        return body

    def outgoing_body(self) -> bytes:
        """The bytes to forward: ``written_body`` (what was parsed, serialised again), unless a stage patched the
        body or the proxy's own fields were lifted out of it (then :meth:`outgoing_json`, serialised)."""
        if not self.patches and not self.proxy_fields and self.written_body is not None:
            return self.written_body
        if self.body is None and not self.patches:
            return b""
        try:
            return orjson.dumps(self.outgoing_json())
        except TypeError:  # orjson encodes at most 255 levels of nesting (it decodes 1024)
            message = "the request body nests too deeply to be forwarded"
            raise ProxyError(400, message, code="invalid_json") from None


SLOTS = frozenset(f.name for f in fields(RequestContext)) - {"handoffs"}
"""The names of the context's slots (what stages may declare in ``needs``/``gives``, besides :class:`Handoff` keys)."""
