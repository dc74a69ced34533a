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

Bounds. A user holds at most ``per_user`` keys and the store ``max_entries`` in all; and, in bytes, a user holds at
most ``max_bytes_per_user`` of kept answers and the store ``max_bytes`` in all (a kept key counts its answer, its
key and :data:`RECORD_OVERHEAD`; see :func:`held_bytes`). Past any cap the oldest finished key goes first — the
user's own, or, when the whole store is full, one of the user holding the most keys (bytes) — so one user's flood of
keys or of large answers never evicts another user's within its fair share. An answer that cannot fit (larger than
the user's byte budget, which then stays as it was, or no finished key left to make room) is not kept: its key is
freed, as for an answer over ``max_response_bytes``. A running claim is never evicted (its retries would run, and be
charged, again): a claim that would need one to go is refused with 429 and ``Retry-After``. A running claim expires
after ``running_ttl_s``, so a proxy that died mid-request does not block its key for longer.

Each claim carries an owner token (random, per request): keeping or freeing a key acts only on the owner's claim,
and a claim repeated by a store client that lost the first answer (a connection dropped after Redis ran it) finds
its own claim and goes on.

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
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from multidict import CIMultiDict

from normalizer.canonical import user_digest
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.outcome import add_headers
from proxy.core.pipeline import Next
from proxy.core.sse import DONE
from proxy.credits.settings import IdempotencySettings
from proxy.credits.stages import CHARGED, LEDGER_ID, REMAINING, RESERVED
from proxy.credits.store import CreditStoreUnavailable

_SETTINGS = IdempotencySettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.idempotency")

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
_VALID_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_NOT_REPLAYED = frozenset({"x-request-id", "content-length", "date", CHARGED.lower(), REMAINING.lower(),
                           RESERVED.lower()})
"""Headers of the first answer that a replay does not repeat: transport, and what the first request was charged."""


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


@dataclass(frozen=True, slots=True)
class Full:
    """The user (or the store) holds as many running claims as it may: no key can make room."""


Claim = Claimed | Running | Mismatch | Kept | Full


@dataclass(frozen=True, slots=True)
class Record:
    """What a store holds for one key: the fingerprint it is tied to, the owner of its claim, and the kept answer
    once there is one."""

    fingerprint: str
    owner: str = ""
    answer: bytes | None = None

    @property
    def running(self) -> bool:
        return self.answer is None


RECORD_OVERHEAD = 128
"""Bytes counted for a kept key beyond its answer and key: the fingerprint, owner and the store's bookkeeping."""


def held_bytes(key: str, answer: bytes) -> int:
    """The bytes a kept key counts against its user's and the store's budgets."""
    return len(answer) + len(key) + RECORD_OVERHEAD


def fingerprint(method: str, target: str, body: bytes) -> str:
    """32 hex digits naming a request's method, target (path and query) and body bytes."""
    digest = hashlib.blake2b(digest_size=16, person=b"ragproxy-idem")
    for part in (method.encode(), target.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def decide(record: Record | None, print_: str, owner: str) -> Claim:
    """What a request with fingerprint ``print_`` and claim token ``owner`` gets, given what is held under its key
    (``None``: nothing)."""
    if record is None:
        return Claimed()
    if record.fingerprint != print_:
        return Mismatch()
    if record.answer is not None:
        return Kept(record.answer)
    return Claimed() if record.owner == owner else Running()


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
    if LEDGER_ID in headers:  # billing is on: this request is charged nothing
        headers[CHARGED] = "0"
    return Reply(status=int(meta["status"]), headers=headers, body=body)


class IdempotencyStore(Protocol):
    """Records of idempotency keys; each operation is atomic per key."""

    async def claim(self, scope: str, key: str, print_: str, owner: str, running_ttl_s: float) -> Claim:
        """:func:`decide` on the record under ``(scope, key)``; a :class:`Claimed` key is held as running by
        ``owner`` (room made as the module docstring says, or :class:`Full`)."""

    async def keep(self, scope: str, key: str, owner: str, answer: bytes, ttl_s: float) -> bool:
        """Keep the answer of ``owner``'s running claim for ``ttl_s``, making room in bytes as the module docstring
        says; ``False``: not kept (the claim is gone, or the answer does not fit: then the claim is dropped)."""

    async def free(self, scope: str, key: str, owner: str) -> None:
        """Drop ``owner``'s running claim (nothing if the key holds anything else)."""

    async def close(self) -> None:
        """Release connections."""


class MemoryIdempotencyStore:
    """Records in this process, each until its expiry, bounded per user and in all, in keys and in bytes (see the
    module docstring).

    Per user, an ordered map key → (record, expiry), oldest first; users are also filed by how many keys they hold,
    so that the one holding the most is found at once when the whole store is full of keys."""

    def __init__(self, max_entries: int = _SETTINGS.max_entries, per_user: int = _SETTINGS.max_entries_per_user, *,
                 max_bytes: int = _SETTINGS.max_bytes, max_bytes_per_user: int = _SETTINGS.max_bytes_per_user,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.per_user = per_user
        self.max_bytes = max_bytes
        self.max_bytes_per_user = max_bytes_per_user
        self.clock = clock
        self._users: dict[str, OrderedDict[str, tuple[Record, float]]] = {}
        self._by_size: dict[int, set[str]] = {}
        self._held: dict[str, int] = {}
        self.entries = 0
        self.bytes = 0

    def _get(self, scope: str, key: str) -> Record | None:
        records = self._users.get(scope)
        held = records.get(key) if records is not None else None
        if held is None:
            return None
        if held[1] <= self.clock():
            self._drop(scope, key)
            return None
        return held[0]

    def _file(self, scope: str, before: int, after: int) -> None:
        """Move ``scope`` from the users holding ``before`` keys to those holding ``after``."""
        if before:
            self._by_size[before].discard(scope)
            if not self._by_size[before]:
                del self._by_size[before]
        if after:
            self._by_size.setdefault(after, set()).add(scope)

    def _count(self, scope: str, key: str, record: Record, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) a record's bytes from its user's and the store's."""
        if record.answer is None:
            return
        size = sign * held_bytes(key, record.answer)
        self.bytes += size
        self._held[scope] = self._held.get(scope, 0) + size
        if not self._held[scope]:
            del self._held[scope]

    def _drop(self, scope: str, key: str) -> None:
        records = self._users[scope]
        record, _ = records.pop(key)
        self._count(scope, key, record, -1)
        self.entries -= 1
        self._file(scope, len(records) + 1, len(records))
        if not records:
            del self._users[scope]

    def _evict_one(self, scope: str) -> bool:
        """Drop the oldest expired or finished record of ``scope`` (never a running claim); ``False``: none."""
        now = self.clock()
        for key, (record, expiry) in self._users.get(scope, OrderedDict()).items():
            if expiry <= now or not record.running:
                self._drop(scope, key)
                return True
        return False

    def _make_room(self, scope: str, keys: int = 0, size: int = 0) -> bool:
        """Evict until ``scope`` can hold ``keys`` more keys and ``size`` more bytes; ``False``: it cannot."""
        while len(self._users.get(scope, ())) + keys > self.per_user \
                or self._held.get(scope, 0) + size > self.max_bytes_per_user:
            if not self._evict_one(scope):
                return False
        while self.entries + keys > self.max_entries:
            largest_first = [user for count in sorted(self._by_size, reverse=True) for user in self._by_size[count]]
            if not any(self._evict_one(user) for user in largest_first):
                return False
        while self.bytes + size > self.max_bytes:  # the user holding the most bytes first; among equals, others
            most_first = sorted(self._held, key=lambda user: (self._held[user], user != scope), reverse=True)
            if not any(self._evict_one(user) for user in most_first):
                return False
        return True

    def _set(self, scope: str, key: str, record: Record, ttl_s: float) -> None:
        records = self._users.setdefault(scope, OrderedDict())
        held = records.get(key)
        records[key] = (record, self.clock() + ttl_s)
        self._count(scope, key, record, 1)
        if held is not None:
            self._count(scope, key, held[0], -1)
            return
        self.entries += 1
        self._file(scope, len(records) - 1, len(records))

    async def claim(self, scope: str, key: str, print_: str, owner: str, running_ttl_s: float) -> Claim:
        held = self._get(scope, key)
        claim = decide(held, print_, owner)
        if isinstance(claim, Claimed) and held is None:
            if not self._make_room(scope, keys=1):
                return Full()
            self._set(scope, key, Record(print_, owner), running_ttl_s)
        return claim

    async def keep(self, scope: str, key: str, owner: str, answer: bytes, ttl_s: float) -> bool:
        held = self._get(scope, key)
        if held is None or not held.running or held.owner != owner:
            return False
        size = held_bytes(key, answer)
        if size > min(self.max_bytes_per_user, self.max_bytes) or not self._make_room(scope, size=size):
            self._drop(scope, key)
            return False
        self._set(scope, key, Record(held.fingerprint, owner, answer), ttl_s)
        return True

    async def free(self, scope: str, key: str, owner: str) -> None:
        held = self._get(scope, key)
        if held is not None and held.running and held.owner == owner:
            self._drop(scope, key)

    async def close(self) -> None:
        self._users.clear()
        self._by_size.clear()
        self._held.clear()
        self.entries = 0
        self.bytes = 0


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
        except CreditStoreUnavailable as exc:  # fail closed: run without the key, a retry would pay again
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
            except CreditStoreUnavailable as exc:  # the claim expires after running_ttl_s
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
            except CreditStoreUnavailable as exc:  # the answer was produced (and charged): it still goes out
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
