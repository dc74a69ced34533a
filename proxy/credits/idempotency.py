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
* the store unreachable (Redis down): the request runs as one without a key would.

A running claim expires after ``running_ttl_s``, so a proxy that died mid-request does not block its key for longer.
The decisions (:func:`fingerprint`, :func:`decide`, the answer format) are pure; the stores keep records in process
memory (:class:`MemoryIdempotencyStore`, embedded mode) or in Redis (:mod:`proxy.credits.redis_idempotency`,
shared by every replica).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from multidict import CIMultiDict

from normalizer.canonical import user_digest
from proxy.context import Reply, RequestContext
from proxy.credits.store import CreditStoreUnavailable
from proxy.errors import ProxyError
from proxy.pipeline import Next
from proxy.sse import DONE

log = logging.getLogger("ragproxy.idempotency")

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
_VALID_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_NOT_REPLAYED = frozenset({"x-request-id", "content-length", "date"})


@dataclass(frozen=True, slots=True)
class Claimed:
    """The key was free: this request runs and its answer is kept."""


@dataclass(frozen=True, slots=True)
class Running:
    """The first request with this key has not finished yet."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used for another request."""


@dataclass(frozen=True, slots=True)
class Kept:
    """The key's first request finished: its answer, as :func:`encode_answer` wrote it."""

    answer: bytes


Claim = Claimed | Running | Mismatch | Kept


@dataclass(frozen=True, slots=True)
class Record:
    """What a store holds for one key: the fingerprint it is tied to, and the kept answer once there is one."""

    fingerprint: str
    answer: bytes | None = None


def fingerprint(method: str, target: str, body: bytes) -> str:
    """32 hex digits naming a request's method, target (path and query) and body bytes."""
    digest = hashlib.blake2b(digest_size=16, person=b"ragproxy-idem")
    for part in (method.encode(), target.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def decide(record: Record | None, print_: str) -> Claim:
    """What a request with fingerprint ``print_`` gets, given what is held under its key (``None``: nothing)."""
    if record is None:
        return Claimed()
    if record.fingerprint != print_:
        return Mismatch()
    return Running() if record.answer is None else Kept(record.answer)


def encode_answer(status: int, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """An answer as kept: a JSON line (status and headers), then the body bytes."""
    kept = [[name, value] for name, value in headers if name.lower() not in _NOT_REPLAYED]
    return orjson.dumps({"status": status, "headers": kept}) + b"\n" + body


def decode_answer(answer: bytes) -> Reply:
    """The reply that replays a kept answer."""
    head, _, body = answer.partition(b"\n")
    meta = orjson.loads(head)
    headers: CIMultiDict[str] = CIMultiDict((str(name), str(value)) for name, value in meta["headers"])
    headers[REPLAYED] = "true"
    return Reply(status=int(meta["status"]), headers=headers, body=body)


class IdempotencyStore(Protocol):
    """Records of idempotency keys; each operation is atomic per key."""

    async def claim(self, scope: str, key: str, print_: str, running_ttl_s: float) -> Claim:
        """:func:`decide` on the record under ``(scope, key)``; a :class:`Claimed` key is held as running."""

    async def keep(self, scope: str, key: str, print_: str, answer: bytes, ttl_s: float) -> None:
        """Keep the answer of the running claim ``print_`` for ``ttl_s`` (nothing if the claim is gone)."""

    async def free(self, scope: str, key: str, print_: str) -> None:
        """Drop the running claim ``print_`` (nothing if the key holds anything else)."""

    async def close(self) -> None:
        """Release connections."""


class MemoryIdempotencyStore:
    """Records in this process, at most ``max_entries`` (the oldest go first), each until its expiry."""

    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._records: OrderedDict[tuple[str, str], tuple[Record, float]] = OrderedDict()

    def _get(self, slot: tuple[str, str]) -> Record | None:
        held = self._records.get(slot)
        if held is None:
            return None
        if held[1] <= self.clock():
            del self._records[slot]
            return None
        return held[0]

    def _set(self, slot: tuple[str, str], record: Record, ttl_s: float) -> None:
        self._records.pop(slot, None)
        self._records[slot] = (record, self.clock() + ttl_s)
        while len(self._records) > self.max_entries:
            self._records.popitem(last=False)

    async def claim(self, scope: str, key: str, print_: str, running_ttl_s: float) -> Claim:
        claim = decide(self._get((scope, key)), print_)
        if isinstance(claim, Claimed):
            self._set((scope, key), Record(print_), running_ttl_s)
        return claim

    async def keep(self, scope: str, key: str, print_: str, answer: bytes, ttl_s: float) -> None:
        if self._get((scope, key)) == Record(print_):
            self._set((scope, key), Record(print_, answer), ttl_s)

    async def free(self, scope: str, key: str, print_: str) -> None:
        if self._get((scope, key)) == Record(print_):
            del self._records[(scope, key)]

    async def close(self) -> None:
        self._records.clear()


class Idempotency:
    """Answer a repeated ``Idempotency-Key`` from the first request's answer (see the module docstring)."""

    name = "idempotency"
    needs = frozenset({"tenant", "user"})
    gives: frozenset[str] = frozenset()

    def __init__(self, store: IdempotencyStore, *, ttl_s: float = 86_400.0, running_ttl_s: float = 600.0,
                 max_response_bytes: int = 4 * 1024 * 1024) -> None:
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
        try:
            claim = await self.store.claim(scope, key, print_, self.running_ttl_s)
        except CreditStoreUnavailable as exc:  # fail open: the request runs as one without a key would
            log.warning("idempotency store unavailable, running %s without its key: %s", ctx.request_id, exc)
            return await call_next(ctx)
        if isinstance(claim, Kept):
            return decode_answer(claim.answer)
        if isinstance(claim, Running):
            raise ProxyError(409, f"a request with this {HEADER} is still being processed; retry shortly",
                             code="idempotency_key_in_use", headers={"Retry-After": "1"})
        if isinstance(claim, Mismatch):
            raise ProxyError(422, f"this {HEADER} was already used for a different request",
                             code="idempotency_key_reused")
        async def free() -> None:
            try:
                await self.store.free(scope, key, print_)
            except CreditStoreUnavailable as exc:  # the claim expires after running_ttl_s
                log.warning("idempotency store unavailable, %s's key stays claimed until it expires: %s",
                            ctx.request_id, exc)

        async def keep(body: bytes) -> bool:
            if len(body) > self.max_response_bytes:
                return False
            headers = CIMultiDict(reply.headers)
            headers.update(ctx.response_headers)
            try:
                await self.store.keep(scope, key, print_, encode_answer(reply.status, list(headers.items()), body),
                                      self.ttl_s)
            except CreditStoreUnavailable as exc:  # the answer was produced (and charged): it still goes out
                log.warning("idempotency store unavailable, %s's answer is not kept: %s", ctx.request_id, exc)
                return False
            return True

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
