"""Stored responses belong to the tenant that made them and live on the replica that made them; so do their items.

Two stages over one :class:`StoredResponses` (the owners store of :mod:`proxy.stored.owners`):

- :class:`ClaimStoredResponses`, early in the ``POST /v1/responses`` pipeline (before credits and every cache
  tier): every stored object the body names must be the caller's (:meth:`StoredResponses.check_body`) — the
  response it continues (``previous_response_id``; the upstream's own answer to an unknown id, a 400
  ``previous_response_not_found``) and the items it has the upstream read from its store (``item_reference`` input
  items, reasoning items given by id: a 404 ``Item with id '...' not found.``) — and the request is pinned
  (:data:`~proxy.upstream.forward.PINNED`) to the replica that keeps them. On the way back, a response the upstream
  made and stores is recorded as this tenant's, on the replica that answered (``ctx.replica``), with the id of
  each of its output items: a complete reply before it is handed back, a stream as its ``response.created`` and
  ``response.output_item.added`` events pass, before the client sees the ids. Cache hits record nothing: a hit is
  the stored original, recorded when it was made, and exact keys of stored requests are never shared across
  tenants (:class:`~proxy.answers.cache_policy.Canonicalize`).
- :class:`StoredResponseRequests`, in the pipeline of each request about stored state
  (:class:`~proxy.core.endpoints.Resource` rows: ``GET``/``DELETE /v1/responses/{response_id}``, ``GET
  .../input_items``, ``POST .../cancel``, ``POST /v1/responses/input_tokens`` and ``/compact``): the response its
  path names (typed, ``ctx.path_params``) and every id its body names are checked the same way. Another tenant's
  id, or an id the proxy does not know, is answered exactly as the upstream answers an id that does not exist; the
  tenant's own goes to the replica that keeps it. A ``DELETE`` the upstream accepted forgets the owner and
  invalidates every cached entry that carries the id (the response itself, and answers that continued it: tag
  ``response:<id>``); so does an upstream 404 for an id, or a ``previous_response_not_found`` (deleted at the
  upstream directly, or expired there).

Items are owned through the response that made them: the proxy knows an item id only from the output of a stored
response it relayed (the upstream made the id, for that response's tenant). An input item's id may have been
written by any client, so a reference to one is refused as unknown, as is any id the proxy never saw. Objects the
proxy serves no API for — conversations, prompt templates, files, vector stores, containers — are stored upstream
under the proxy's key, where no owner can be checked: a body naming one is refused with 400
(:func:`normalizer.responses.unowned_reference`).

A response made in a user-scoped (private) request is its user's: its owner is ``<tenant>~<user digest>``, as in
keys, and only that user may fetch, delete or continue it, or reference its items. A cached copy of a stored
response is served only while its owner is recorded (:func:`proxy.answers.replies.servable`), so nothing a race
with its ``DELETE`` left behind is served. A response made while the owner store is down (shared mode: Redis) has
its owner kept in memory (at most :data:`MAX_UNRECORDED`), known to this replica at once and recorded at the next
use of the store once it is back.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from normalizer.canonical import user_digest
from normalizer.paths import ITEM_ID
from normalizer.responses import continued_response, referenced_items, stores, unowned_reference
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import Resource
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Next
from proxy.core.sse import EventSplitter, event_data
from proxy.stored.owners import OwnersUnavailable, ResponseOwner, ResponseOwners
from proxy.upstream.forward import PINNED
from tiers.budgets import MemoryAccount
from tiers.invalidation import Removal, Selector

log = logging.getLogger("ragproxy.responses")

MAX_UNRECORDED = 10_000
"""Owners kept in memory while the owner store is down (at most :data:`UNRECORDED_BYTES` each: 4 MB in all)."""
UNRECORDED_BYTES = 400
"""One kept owner: a 53-character response id, a tenant and user digest of 80, its place in the order (345 bytes,
tracemalloc), with room for longer tenant names."""
MAX_REFERENCES = 1_000
"""Distinct stored items one request may reference (each is one look-up in the owner store)."""
USER_SEPARATOR = "~"
"""Between the tenant and the user digest in the owner of a response made in a user-scoped request (as in keys)."""
_CREATED = b'"response.created"'
_ITEM_ADDED = b'"response.output_item.added"'


def not_found(response_id: str) -> ProxyError:
    """The upstream's answer to a response id it does not know."""
    return ProxyError(404, f"Response with id '{response_id}' not found.", error_type="invalid_request_error")


def previous_not_found(response_id: str) -> ProxyError:
    """The upstream's answer to a ``previous_response_id`` it does not know."""
    return ProxyError(400, f"Previous response with id '{response_id}' not found.", code="previous_response_not_found",
                      param="previous_response_id", error_type="invalid_request_error")


def item_not_found(item_id: str) -> ProxyError:
    """The upstream's answer to an item id it does not know."""
    return ProxyError(404, f"Item with id '{item_id}' not found.", param="input", error_type="invalid_request_error")


def unowned(param: str, what: str) -> ProxyError:
    """A request naming an object stored upstream that no tenant made through the proxy (see the module
    docstring)."""
    return ProxyError(400, f"`{param}` names {what} stored upstream under the proxy's key, where its owner cannot be "
                      "checked: this proxy serves no API that makes one, so none is a tenant's. Send the content "
                      "itself instead.", code="unsupported_parameter", param=param,
                      error_type="invalid_request_error")


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

    async def pin(self, ctx: RequestContext, stored_id: str, refusal: ProxyError) -> None:
        """Pin ``ctx`` to the replica keeping ``stored_id`` (a response, or an item of one); ``refusal`` unless
        ``ctx``'s tenant made it and it lives where every other object the request names lives."""
        await self._record_late()
        try:
            owner = self._unrecorded.get(stored_id) or await self.owners.owner(stored_id)
        except OwnersUnavailable as exc:
            log.warning("owner of %s not known: %s", stored_id, exc)
            raise ProxyError(503, "the store of response owners is unavailable; retry shortly",
                             code="owners_unavailable", headers={"Retry-After": "2"}) from None
        replica = self.replicas.get(owner.replica) if owner is not None and _may_use(ctx, owner.tenant) else None
        if replica is None or ctx.handoffs.get(PINNED) not in (None, replica):
            raise refusal
        ctx.handoffs[PINNED] = replica

    async def check_body(self, ctx: RequestContext, body: Mapping[str, Any]) -> str | None:
        """Every stored object a Responses body names, checked as the caller's and pinned (see the module
        docstring); the response it continues, if any."""
        refused = unowned_reference(body)
        if refused is not None:
            raise no_conversations() if refused[0] == "conversation" else unowned(*refused)
        if body.get("previous_response_id") is not None and continued_response(body) is None:
            raise ProxyError(400, "`previous_response_id` must be a string", code="invalid_type",
                             param="previous_response_id", error_type="invalid_request_error")
        previous = continued_response(body)
        if previous is not None:
            await self.pin(ctx, previous, previous_not_found(previous))
        items = referenced_items(body)
        if any(not isinstance(item, str) for item in items):
            raise ProxyError(400, "an item reference needs a string `id`", code="invalid_type", param="input",
                             error_type="invalid_request_error")
        distinct = dict.fromkeys(items)
        if len(distinct) > MAX_REFERENCES:
            raise ProxyError(400, f"the input references {len(distinct)} stored items; at most {MAX_REFERENCES} are "
                             "accepted in one request", code="too_many_references", param="input")
        for item in distinct:
            if not ITEM_ID.accepts(item):
                raise item_not_found(item)
            await self.pin(ctx, item, item_not_found(item))
        return previous

    def _owner(self, ctx: RequestContext) -> ResponseOwner | None:
        """Who owns what the upstream stores for ``ctx`` (``None``: it was not answered upstream)."""
        if ctx.replica is None:
            return None
        scope = ctx.tenant if ctx.user_scope is None else f"{ctx.tenant}{USER_SEPARATOR}{ctx.user_scope}"
        return ResponseOwner(scope, ctx.replica)

    async def record(self, ctx: RequestContext, response: Any) -> None:
        """Record a response object the upstream made for ``ctx`` as its tenant's, and its output items, when the
        upstream keeps it."""
        owner = self._owner(ctx)
        if not isinstance(response, Mapping) or not isinstance(response.get("id"), str) or owner is None:
            return
        if not response.get("store", stores(ctx.body or {})):
            return
        await self._keep(response["id"], owner)
        output = response.get("output")
        for item in output if isinstance(output, list) else ():
            if isinstance(item, Mapping) and isinstance(item.get("id"), str):
                await self._keep(item["id"], owner)

    async def record_item(self, ctx: RequestContext, item: Any) -> None:
        """Record an output item the upstream made (a streamed ``response.output_item.added``) as its tenant's."""
        owner = self._owner(ctx)
        if owner is not None and isinstance(item, Mapping) and isinstance(item.get("id"), str) \
                and stores(ctx.body or {}):
            await self._keep(item["id"], owner)

    async def _keep(self, stored_id: str, owner: ResponseOwner) -> None:
        await self._record_late()
        try:
            await self.owners.record(stored_id, owner)
        except OwnersUnavailable as exc:  # the response is answered; its owner is recorded once the store is back
            log.warning("owner of stored %s recorded later: %s", stored_id, exc)
            self._unrecorded[stored_id] = owner
            while len(self._unrecorded) > MAX_UNRECORDED:
                dropped, _ = self._unrecorded.popitem(last=False)
                log.error("owner of stored %s dropped: the owner store has been down too long", dropped)

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
    gives = frozenset({PINNED})

    def __init__(self, responses: StoredResponses) -> None:
        self.responses = responses


class ClaimStoredResponses(_OwnersStage):
    """``POST /v1/responses``: continue and reference only the tenant's own stored objects; record the ones it
    makes."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        body = ctx.body or {}
        previous = await self.responses.check_body(ctx, body)
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
            reply.chunks = self._record_as_streamed(ctx, reply.chunks)
        return reply

    async def _record_as_streamed(self, ctx: RequestContext, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream unchanged; its ``response.created`` and ``response.output_item.added`` events are recorded
        before they are passed on."""
        events = EventSplitter()
        try:
            async for chunk in chunks:
                for event in events.feed(chunk):
                    created = _payload(event, _CREATED, "response.created", "response")
                    if created is not None:
                        await self.responses.record(ctx, created)
                    added = _payload(event, _ITEM_ADDED, "response.output_item.added", "item")
                    if added is not None:
                        await self.responses.record_item(ctx, added)
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


def _payload(event: bytes, marker: bytes, kind: str, field: str) -> Any:
    """The ``field`` of an event of type ``kind`` (whose data holds ``marker``), else ``None``."""
    data = event_data(event)
    if data is None or marker not in data:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload.get(field) if isinstance(payload, dict) and payload.get("type") == kind else None


class StoredResponseRequests(_OwnersStage):
    """A request about stored state (a :class:`~proxy.core.endpoints.Resource` row): the response its path names
    and every id its body names must be the caller's; it goes to the replica that keeps them."""

    needs = frozenset({"path_params"})

    def __init__(self, responses: StoredResponses, row: Resource) -> None:
        super().__init__(responses)
        self.row = row

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        row = self.row
        named = ctx.path_params.get(row.names) if row.names is not None else None
        if named is not None:
            await self.responses.pin(ctx, named, not_found(named))
        if row.refers and ctx.body is not None:
            await self.responses.check_body(ctx, ctx.body)
        reply = await call_next(ctx)
        if named is not None and (reply.status == 404 or (row.deletes and reply.status == 200)):
            await self.responses.forget(named)  # deleted here, or gone upstream (deleted there, expired)
        return reply
