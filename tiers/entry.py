"""The stored form of a cached response, shared by every tier and backend.

Layout: a 4-byte big-endian header length, a small orjson header (format version, creation time, kind, model, cost,
scope and free-form metadata such as the question text and document ids), then the response body bytes exactly as
they will be sent (for chat/completions: the non-streamed JSON object; a streamed miss is assembled first). Keeping
the body as raw bytes lets an exact hit answer without re-serializing JSON.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

FORMAT_VERSION = 1
_LENGTH = struct.Struct(">I")


class CorruptEntry(ValueError):
    """Stored bytes that do not decode into an entry."""


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """One cached answer."""

    body: bytes
    kind: str
    model: str | None = None
    cost: float = 1.0
    created: float = field(default_factory=time.time)
    meta: dict[str, Any] = field(default_factory=dict)

    def age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.created)

    def encode(self) -> bytes:
        header = orjson.dumps({"v": FORMAT_VERSION, "k": self.kind, "m": self.model, "c": self.cost,
                               "t": self.created, "x": self.meta})
        return _LENGTH.pack(len(header)) + header + self.body

    @classmethod
    def decode(cls, raw: bytes) -> CachedResponse:
        try:
            (length,) = _LENGTH.unpack_from(raw)
            header = orjson.loads(raw[4:4 + length])
            if header["v"] != FORMAT_VERSION or 4 + length > len(raw):
                raise CorruptEntry(f"unsupported entry version {header['v']}")
            return cls(body=raw[4 + length:], kind=header["k"], model=header["m"], cost=float(header["c"]),
                       created=float(header["t"]), meta=header["x"])
        except (struct.error, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorruptEntry(str(exc)) from None
