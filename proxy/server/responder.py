"""Writing one response on a keep-alive HTTP/1.1 connection: complete in one write, or streamed chunk by chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

HeaderItems = Iterable[tuple[str, str]]

_STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("ascii"))
                 for status in HTTPStatus}
_NO_BODY = frozenset({204, 304})
# Set by the responder itself; a handler's own copies would contradict the framing.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date"})
_date_second = 0
_date_line = b""


def _date_header() -> bytes:
    """``Date: ...\\r\\n``, formatted once per second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
    return _date_line


def _encode(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")


class Channel(Protocol):
    """What a responder needs from its connection."""

    closing: bool

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Responder:
    """The response to one request: :meth:`send` a complete one, or :meth:`start`, :meth:`write`, :meth:`end`.

    Header names and values go out as given, except the framing ones (``Content-Length``, ``Transfer-Encoding``,
    ``Connection``, ``Date``), which the responder sets. A streamed response without a length is sent chunked
    (close-delimited to an HTTP/1.0 client). Writing to a connection the client closed raises
    :class:`ConnectionResetError`.
    """

    __slots__ = ("_channel", "_chunked", "_head_only", "_pending", "_version_10", "finished", "keep_alive",
                 "started")

    def __init__(self, channel: Channel, *, head_only: bool, http10: bool, keep_alive: bool) -> None:
        self._channel = channel
        self._head_only = head_only
        self._version_10 = http10
        self.keep_alive = keep_alive
        self.started = False
        self.finished = False
        self._chunked = False
        self._pending = b""  # a streamed response's head, until the first chunk or the next loop turn

    def _head(self, status: int, headers: HeaderItems, length: int | None) -> bytes:
        if self.started:
            raise RuntimeError("the response was already started")
        if self._channel.closing:
            raise ConnectionResetError("the client closed the connection")
        self.started = True
        lines = [f"{name}: {value}\r\n" for name, value in headers
                 if name.lower() not in _FRAMING and "\n" not in value and "\r" not in value]
        if length is not None and status not in _NO_BODY:
            lines.append(f"Content-Length: {length}\r\n")
        parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status, _date_header(),
                 _encode("".join(lines))]
        if length is None and status not in _NO_BODY and not self._head_only:
            if self._version_10:
                self.keep_alive = False
            else:
                self._chunked = True
                parts.append(b"Transfer-Encoding: chunked\r\n")
        if not self.keep_alive:
            parts.append(b"Connection: close\r\n")
        elif self._version_10:
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def send(self, status: int, headers: HeaderItems, body: bytes = b"") -> None:
        """Send a complete response (without its body when the request was ``HEAD``)."""
        head = self._head(status, headers, len(body))
        self._channel.write(head if self._head_only or status in _NO_BODY or not body else head + body)
        self.finished = True

    def start(self, status: int, headers: HeaderItems) -> None:
        """Begin a streamed response. The head goes out with the first chunk when that is already at hand (one
        write, one segment: what an upstream usually sends together), else at the event loop's next turn."""
        self._pending = self._head(status, headers, None)
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        head, self._pending = self._pending, b""
        if head:
            self._channel.write(head)

    async def write(self, chunk: bytes) -> None:
        """Send one piece of a streamed body, waiting while the client reads slower than we write."""
        channel = self._channel
        if channel.closing:
            raise ConnectionResetError("the client closed the connection")
        if not chunk or self._head_only:
            return
        data = b"%x\r\n%b\r\n" % (len(chunk), chunk) if self._chunked else chunk
        if self._pending:
            data, self._pending = self._pending + data, b""
        channel.write(data)
        await channel.drain()

    def end(self) -> None:
        """Finish a streamed response."""
        if self.finished:
            return
        self.finished = True
        if not self._channel.closing:
            tail, self._pending = self._pending + (b"0\r\n\r\n" if self._chunked else b""), b""
            if tail:
                self._channel.write(tail)
