"""Idempotency-key records, the pure decisions on them and the store contract (the stage's behaviour:
:mod:`proxy.idempotency.stage`).

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
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from multidict import CIMultiDict

from proxy.core.context import Reply
from proxy.credits.stages import CHARGED, LEDGER_ID, REMAINING, RESERVED

REPLAYED = "Idempotent-Replayed"
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
