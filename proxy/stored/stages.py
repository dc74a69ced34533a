"""Stored responses belong to the tenant that made them and live on the replica that made them.

Two stages over one :class:`StoredResponses` (the owners store of :mod:`proxy.stored.owners`):

- :class:`ClaimStoredResponses`, early in the ``POST /v1/responses`` pipeline (before credits and every cache
  tier): a request that continues a response (``previous_response_id``) is refused unless its tenant made that
  response — with the upstream's own answer to an unknown id, a 400 ``previous_response_not_found`` — and is
  pinned (``ctx.pinned``) to the replica that keeps it. On the way back, a response the upstream made and stores
  is recorded as this tenant's, on the replica that answered (``ctx.replica``): a complete reply before it is
  handed back, a stream when its ``response.created`` event passes, before the client sees the id. Cache hits
  record nothing: a hit is the stored original, recorded when it was made, and exact keys of stored requests are
  never shared across tenants (:class:`~proxy.answers.cache_policy.Canonicalize`).
- :class:`StoredResponseRequests`, the one stage of the requests about a response: ``GET``/``DELETE
  /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel`` (any other path
  under ``/v1/responses/`` that names an id too), and ``POST /v1/responses/input_tokens`` and ``/compact``, whose
  bodies may carry a ``previous_response_id``. Another tenant's id, or an id the proxy does not know, is answered
  404 exactly as the upstream answers an id that does not exist; the tenant's own goes to the replica that keeps
  it. A ``DELETE`` the upstream accepted forgets the owner and invalidates every cached entry that carries the id
  (the response itself, and answers that continued it: tag ``response:<id>``); so does an upstream 404 for an id,
  or a ``previous_response_not_found`` (deleted at the upstream directly, or expired there).

A response made in a user-scoped (private) request is its user's: its owner is ``<tenant>~<user digest>``, as in
keys, and only that user may fetch, delete or continue it. Bodies are read as JSON (a key written with escapes is
the same key). ``conversation`` is refused (400): the proxy serves no Conversations API, so no conversation was made
through it and its owner cannot be checked. A cached copy of a stored response is served only while its owner is
recorded (:func:`proxy.answers.replies.servable`), so nothing a race with its ``DELETE`` left behind is served.
A response made while the owner store is down (shared mode: Redis) has its owner kept in memory (at most
:data:`MAX_UNRECORDED`), known to this replica at once and recorded at the next use of the store once it is back.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from normalizer.canonical import user_digest
from normalizer.responses import continued_response, stores
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Next
from proxy.core.sse import EventSplitter, event_data
from proxy.stored.owners import OwnersUnavailable, ResponseOwner, ResponseOwners
from tiers.budgets import MemoryAccount
from tiers.invalidation import Removal, Selector

log = logging.getLogger("ragproxy.responses")

PREFIX = "/v1/responses/"
MAX_UNRECORDED = 10_000
"""Owners kept in memory while the owner store is down (at most :data:`UNRECORDED_BYTES` each: 4 MB in all)."""
UNRECORDED_BYTES = 400
"""One kept owner: a 53-character response id, a tenant and user digest of 80, its place in the order (345 bytes,
tracemalloc), with room for longer tenant names."""
USER_SEPARATOR = "~"
"""Between the tenant and the user digest in the owner of a response made in a user-scoped request (as in keys)."""
COLLECTION_ROUTES = frozenset({"input_tokens", "compact"})
"""Paths under ``/v1/responses/`` that name no response (their bodies may name one)."""
_CREATED = b"response.created"
_SCAN_LIMIT = 64 * 1024
"""Bytes of a stream searched for its ``response.created`` event (the API's first event)."""


def not_found(response_id: str) -> ProxyError:
    """The upstream's answer to a response id it does not know."""
    return ProxyError(404, f"Response with id '{response_id}' not found.", error_type="invalid_request_error")


def previous_not_found(response_id: str) -> ProxyError:
    """The upstream's answer to a ``previous_response_id`` it does not know."""
    return ProxyError(400, f"Previous response with id '{response_id}' not found.", code="previous_response_not_found",
                      param="previous_response_id", error_type="invalid_request_error")


def named_response(path: str) -> str | None:
    """The response id a path under ``/v1/responses/`` names, or ``None`` (``input_tokens``, ``compact``)."""
    if not path.startswith(PREFIX):
        return None
    first = path[len(PREFIX):].split("/", 1)[0]
    return None if first in COLLECTION_ROUTES else first


class StoredResponses:
    """Checks and records the owners of stored responses; pins requests to the replica that keeps one."""

    def __init__(self, owners: ResponseOwners, replicas: Sequence[str],
                 invalidate: Callable[[Selector], Awaitable[Removal]] | None = None) -> None:
        """``replicas``: the LLM replicas' labels, by index; ``invalidate``: removes cached entries."""
        self.owners = owners
        self.replicas = {label: index for index, label in enumerate(replicas)}
        self.invalidate = invalidate
        self._unrecorded: OrderedDict[str, ResponseOwner] = OrderedDict()
        """Owners the store could not take when their responses were made, oldest first (at most
        :data:`MAX_UNRECORDED`): recorded at the next use of the store, and known to this replica meanwhile."""

    def memory(self) -> list[MemoryAccount]:
        """The owners kept while the store is down, bounded by count (:data:`MAX_UNRECORDED`)."""
        return [MemoryAccount("unrecorded_owners", len(self._unrecorded) * UNRECORDED_BYTES,
                              MAX_UNRECORDED * UNRECORDED_BYTES, len(self._unrecorded), "MAX_UNRECORDED")]

    async def _record_late(self) -> None:
        """Record the owners the store could not take before, oldest first, while it takes them."""
        while self._unrecorded:
            response_id, owner = next(iter(self._unrecorded.items()))
            try:
                await self.owners.record(response_id, owner)
            except OwnersUnavailable:
                return
            self._unrecorded.pop(response_id, None)

    async def pin(self, ctx: RequestContext, response_id: str, refusal: ProxyError) -> None:
        """Pin ``ctx`` to the replica keeping ``response_id``; ``refusal`` unless ``ctx``'s tenant made it."""
        await self._record_late()
        try:
            owner = self._unrecorded.get(response_id) or await self.owners.owner(response_id)
        except OwnersUnavailable as exc:
            log.warning("owner of %s not known: %s", response_id, exc)
            raise ProxyError(503, "the store of response owners is unavailable; retry shortly",
                             code="owners_unavailable", headers={"Retry-After": "2"}) from None
        replica = self.replicas.get(owner.replica) if owner is not None and _may_use(ctx, owner.tenant) else None
        if replica is None:
            raise refusal
        ctx.pinned = replica

    async def record(self, ctx: RequestContext, response: Any) -> None:
        """Record a response object the upstream made for ``ctx`` as its tenant's, when the upstream keeps it."""
        if not isinstance(response, Mapping) or not isinstance(response.get("id"), str) or ctx.replica is None:
            return
        if not response.get("store", stores(ctx.body or {})):
            return
        scope = ctx.tenant if ctx.user_scope is None else f"{ctx.tenant}{USER_SEPARATOR}{ctx.user_scope}"
        await self._record_late()
        try:
            await self.owners.record(response["id"], ResponseOwner(scope, ctx.replica))
        except OwnersUnavailable as exc:  # the response is answered; its owner is recorded once the store is back
            log.warning("owner of stored response %s recorded later: %s", response["id"], exc)
            self._unrecorded[response["id"]] = ResponseOwner(scope, ctx.replica)
            while len(self._unrecorded) > MAX_UNRECORDED:
                dropped, _ = self._unrecorded.popitem(last=False)
                log.error("owner of stored response %s dropped: the owner store has been down too long", dropped)

    async def forget(self, response_id: str) -> None:
        """A deleted response: its owner and every cached entry carrying its id go."""
        self._unrecorded.pop(response_id, None)
        try:
            await self.owners.forget(response_id)
        except OwnersUnavailable as exc:
            log.warning("owner of deleted response %s not forgotten: %s", response_id, exc)
        if self.invalidate is not None:
            await self.invalidate(Selector(responses=(response_id,)))


def _may_use(ctx: RequestContext, owner: str) -> bool:
    """Whether ``ctx``'s user may use a response owned by ``owner``: its tenant, or — for a response made in a
    user-scoped (private) request — that user of the tenant only."""
    if owner == ctx.tenant:
        return True
    tenant, separator, user = owner.partition(USER_SEPARATOR)
    return bool(separator) and tenant == ctx.tenant and user == user_digest(ctx.tenant, ctx.user)


def no_conversations() -> ProxyError:
    """A request naming an upstream conversation: the proxy serves no Conversations API, so no conversation was made
    through it and none can be checked as the caller's."""
    return ProxyError(400, "`conversation` is not supported through this proxy: conversations are stored upstream "
                      "under the proxy's key, where their owner cannot be checked; send the previous turns as input "
                      "or use previous_response_id", code="unsupported_parameter", param="conversation",
                      error_type="invalid_request_error")


class _OwnersStage:
    name = "stored_responses"
    needs: frozenset[str] = frozenset()
    gives = frozenset({"pinned"})

    def __init__(self, responses: StoredResponses) -> None:
        self.responses = responses


class ClaimStoredResponses(_OwnersStage):
    """``POST /v1/responses``: continue only the tenant's own responses; record the ones it makes."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        body = ctx.body or {}
        if body.get("conversation") is not None:
            raise no_conversations()
        previous = continued_response(body)
        if previous is not None:
            await self.responses.pin(ctx, previous, previous_not_found(previous))
        reply = await call_next(ctx)
        if previous is not None and reply.status in (400, 404) and ctx.replica is not None \
                and b"previous_response_not_found" in (reply.body or b""):
            await self.responses.forget(previous)  # gone upstream: its cached copies go too
        if ctx.replica is None or reply.status != 200 or not stores(body):
            return reply  # answered by a cache tier, failed, or nothing the upstream keeps
        if reply.chunks is None:
            with contextlib.suppress(orjson.JSONDecodeError):
                await self.responses.record(ctx, orjson.loads(reply.body or b""))
        else:
            reply.chunks = self._record_when_created(ctx, reply.chunks)
        return reply

    async def _record_when_created(self, ctx: RequestContext, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream unchanged; its ``response.created`` event is recorded before it is passed on."""
        events: EventSplitter | None = EventSplitter()
        seen = 0
        try:
            async for chunk in chunks:
                if events is not None:
                    seen += len(chunk)
                    for event in events.feed(chunk):
                        created = _created(event)
                        if created is not None:
                            await self.responses.record(ctx, created)
                            events = None
                            break
                    if seen > _SCAN_LIMIT:
                        events = None
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


def _created(event: bytes) -> Any:
    """The response of a ``response.created`` event, else ``None``."""
    data = event_data(event)
    if data is None or _CREATED not in data:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload.get("response") if isinstance(payload, dict) and payload.get("type") == "response.created" \
        else None


class StoredResponseRequests(_OwnersStage):
    """Requests about a stored response (``/v1/responses/...``): the owner's tenant only, sent to its replica."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        path = ctx.request.path
        named = named_response(path)
        if named is not None:
            await self.responses.pin(ctx, named, not_found(named))
        previous = _previous_in(ctx.raw_body) if ctx.method == "POST" else None
        if previous is not None and named is None:
            await self.responses.pin(ctx, previous, previous_not_found(previous))
        reply = await call_next(ctx)
        if named is not None and (reply.status == 404 or (
                ctx.method == "DELETE" and path == PREFIX + named and reply.status == 200)):
            await self.responses.forget(named)  # deleted here, or gone upstream (deleted there, expired)
        return reply


def _previous_in(raw: bytes) -> str | None:
    """The ``previous_response_id`` of a JSON body, read as JSON (a key written with escapes is the same key;
    ``None`` when there is none or the body is not an object); a 400 when it is there and not a string (the owner
    check could not read it), and for a ``conversation`` (see :func:`no_conversations`)."""
    if not raw:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    if body.get("conversation") is not None:
        raise no_conversations()
    if body.get("previous_response_id") is not None and continued_response(body) is None:
        raise ProxyError(400, "`previous_response_id` must be a string", code="invalid_type",
                         param="previous_response_id", error_type="invalid_request_error")
    return continued_response(body)
