"""Idempotency keys: a retried LLM call with the same ``Idempotency-Key`` is answered once and charged once.

The behaviour follows the IETF draft "The Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-
header) and Stripe's API, which it describes:

* a key is scoped per user (the API key's user, within its tenant; in open mode every caller is the anonymous user)
  and tied to the request it first came with: its fingerprint is a digest of the method, the path with its query
  string and the body bytes;
* the first request with a key runs; its 2xx answer (status, headers and body; a stream as its complete body) is
  kept for ``ttl_s`` and replayed to every repeat with the same fingerprint, marked ``Idempotent-Replayed: true``,
  without running anything again (no upstream call, no charge);
* a repeat while the first still runs: ``409 Conflict`` with ``Retry-After``;
* the key with another fingerprint: ``422 Unprocessable Content`` (the draft's answer for a key reused with a
  different payload);
* a first run that did not succeed (an error status, an exception, an aborted stream) or whose answer is larger
  than ``max_response_bytes`` frees the key: a retry runs, and is charged, again. Stripe also keeps 5xx answers;
  the proxy does not, so that a retry after an upstream failure can succeed;
* an empty key, one longer than 255 characters or one that is not visible ASCII: 400;
* a replayed answer was charged when it was first produced: it carries ``X-Credits-Charged: 0`` (what this request
  cost) and the first one's ``X-Credits-Request-ID`` (the charge that paid for it), never the first one's
  ``X-Credits-Remaining``;
* the store unreachable (Redis down, after the client's retries rode out a restart): 503 with ``Retry-After``.
  Running the request without its key would charge a retry a second time.

The bounds on what is kept and the claims' owners: :mod:`proxy.idempotency.records`. The decisions
(:func:`~proxy.idempotency.records.fingerprint`, :func:`~proxy.idempotency.records.decide`, the answer format) are
pure; the stores keep records in process memory (:class:`~proxy.idempotency.memory_store.MemoryIdempotencyStore`,
embedded mode) or in Redis (:mod:`proxy.idempotency.redis_store`, shared by every replica).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator

from multidict import CIMultiDict

from normalizer.canonical import user_digest
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.outcome import add_headers
from proxy.core.pipeline import Next
from proxy.core.sse import DONE
from proxy.idempotency.records import (
    Full,
    IdempotencyStore,
    Kept,
    Mismatch,
    Running,
    decode_answer,
    encode_answer,
    fingerprint,
)
from proxy.idempotency.settings import IdempotencySettings
from proxy.stores.unavailable import StoreUnavailable

_SETTINGS = IdempotencySettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.idempotency")

HEADER = "Idempotency-Key"
_VALID_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")



class Idempotency:
    """Answer a repeated ``Idempotency-Key`` from the first request's answer (see the module docstring)."""

    name = "idempotency"
    needs = frozenset({"tenant", "user"})
    gives: frozenset[str] = frozenset()

    def __init__(self, store: IdempotencyStore, *, ttl_s: float = _SETTINGS.ttl_s,
                 running_ttl_s: float = _SETTINGS.running_ttl_s,
                 max_response_bytes: int = _SETTINGS.max_response_bytes) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.running_ttl_s = running_ttl_s
        self.max_response_bytes = max_response_bytes

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key = ctx.request.headers.get(HEADER)
        if key is None:
            return await call_next(ctx)
        if not _VALID_KEY.match(key):
            raise ProxyError(400, f"{HEADER} must be 1 to 255 visible ASCII characters", code="invalid_idempotency_key")
        scope = user_digest(ctx.tenant, ctx.user)
        print_ = fingerprint(ctx.method, ctx.request.raw_path, ctx.raw_body)
        owner = uuid.uuid4().hex
        try:
            claim = await self.store.claim(scope, key, print_, owner, self.running_ttl_s)
        except StoreUnavailable as exc:  # fail closed: run without the key, a retry would pay again
            log.warning("idempotency store unavailable, refusing %s: %s", ctx.request_id, exc)
            raise ProxyError(503, f"the {HEADER} store is unavailable; retry shortly", code="idempotency_unavailable",
                             headers={"Retry-After": "2"}) from exc
        if isinstance(claim, Kept):
            return decode_answer(claim.answer)
        if isinstance(claim, Running):
            raise ProxyError(409, f"a request with this {HEADER} is still being processed; retry shortly",
                             code="idempotency_key_in_use", headers={"Retry-After": "1"})
        if isinstance(claim, Mismatch):
            raise ProxyError(422, f"this {HEADER} was already used for a different request",
                             code="idempotency_key_reused")
        if isinstance(claim, Full):
            raise ProxyError(429, f"too many requests with an {HEADER} are still being processed; retry shortly",
                             code="idempotency_keys_exhausted", headers={"Retry-After": "1"})

        async def free() -> None:
            try:
                await self.store.free(scope, key, owner)
            except StoreUnavailable as exc:  # the claim expires after running_ttl_s
                log.warning("idempotency store unavailable, %s's key stays claimed until it expires: %s",
                            ctx.request_id, exc)

        async def keep(body: bytes) -> bool:
            if len(body) > self.max_response_bytes:
                return False
            headers = CIMultiDict(reply.headers)
            add_headers(headers, ctx.outcome)
            headers.update(ctx.response_headers)
            try:
                return await self.store.keep(scope, key, owner,
                                             encode_answer(reply.status, list(headers.items()), body), self.ttl_s)
            except StoreUnavailable as exc:  # the answer was produced (and charged): it still goes out
                log.warning("idempotency store unavailable, %s's answer is not kept: %s", ctx.request_id, exc)
                return False

        try:
            reply = await call_next(ctx)
        except BaseException:
            await asyncio.shield(free())
            raise
        if not 200 <= reply.status < 300:
            await free()
            return reply
        if reply.chunks is None:  # kept before it is sent: a client that has the answer finds it kept
            if not await keep(reply.body or b""):
                await free()
            return reply
        kept = False

        async def relay(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            """Keep a stream just before its final event reaches the client (SDKs hang up right after it); past
            ``max_response_bytes`` it is no longer collected (it would not be kept)."""
            nonlocal kept
            collected: list[bytes] | None = []
            size = 0
            tail = b""
            async for chunk in chunks:
                size += len(chunk)
                if collected is not None:
                    collected.append(chunk)
                    if size > self.max_response_bytes:
                        collected = None
                tail = (tail + chunk)[-len(DONE):]
                if tail == DONE and not kept and collected is not None:
                    kept = await keep(b"".join(collected))
                yield chunk

        async def finish(done: Reply, ok: bool, body: bytes) -> None:
            if not kept and not (ok and await keep(body)):
                await free()

        reply.chunks = relay(reply.chunks)
        reply.on_finish(finish)
        return reply
