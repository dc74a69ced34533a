"""The proxy's HTTP/1.1 transport: pooled keep-alive connections, responses parsed by httptools. Every outbound call
goes through it (:class:`~proxy.upstream.client.UpstreamClient` is the one client on top).

Why not aiohttp's client: forwarding is most of what a pass-through request costs the proxy, and with aiohttp's
client (request and response objects, tracing hooks, cookies, redirects, its own stream readers) behind the same
boundary the proxy spent 84% more instructions per request and twice the CPU time (``python -m loadtest.bench
instructions`` and ``overhead``, BENCHMARKS.md). The proxy needs a narrow subset of HTTP/1.1 — send one request
whose body is already in memory, read a response that is either complete or streamed, keep the connection for the
next request — so this module does only that: connection pooling, timeouts, flow control and the one resend on a
stale connection. Parsing is httptools' (the llhttp binding uvicorn uses): chunked transfer coding, keep-alive
rules and malformed responses are llhttp's job, not ours.

Semantics:

* One pool per origin (scheme, host, port) with at most ``limit`` connections; further requests wait for one.
* A connection goes back to the pool only after its response was read to the end and both sides allow keep-alive;
  it is dropped after ``idle_s`` seconds unused (4 s: under the 5 s keep-alive of uvicorn, which vLLM and SGLang
  serve with, and of cpp-httplib, which llama-server serves with, so a connection is not reused just as the server
  closes it). Idle time counts from the response's last byte, as the server's timer does, not from when the
  consumer let go of it: a stream relayed to a slow client is released long after the server went idle.
* ``connect_timeout`` bounds the TCP (and TLS) connect; ``read_timeout`` bounds every silence: the wait for the
  response head and each gap in the body.
* A response head may take at most ``max_head`` bytes (64 KiB by default, as the proxy's own server allows a request
  head): counted while it arrives, since llhttp would otherwise hold a never-ending header field without limit.
  Beyond it the response fails as malformed (:class:`ConnectionReset`, a 502 for the client).
* Streamed bodies queue at most ``HIGH_WATER`` bytes; beyond that the socket stops being read until the consumer
  catches up (backpressure instead of unbounded buffering). A body read whole (:meth:`Response.read`) is read at the
  socket's pace, whatever its size: the caller asked for all of it.
* A pooled connection the server closed just as a request went out on it is replaced by a new one and the request
  sent once more (:meth:`Http1Client.request` says when: never after a response byte, a timeout or a fresh
  connection's failure).
* ``Content-Encoding: gzip``/``deflate`` bodies are decoded (no ``Accept-Encoding`` is sent, so servers rarely use
  them); :attr:`Response.decoded` says so, and the caller drops the header.
* Failures, all :class:`OSError`: :class:`ConnectFailed` (nothing was sent: the one case where resending is safe),
  :class:`ConnectionReset` (closed, reset or malformed after the request was sent), :class:`TimeoutError`, and
  :class:`LocalResourceError` (this process is out of descriptors or memory: no fault of the upstream's).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import errno
import re
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote

import httptools
from multidict import CIMultiDict

Headers = Mapping[str, str] | Sequence[tuple[str, str]]
"""Request headers: a mapping, or name-value pairs (repeated names allowed)."""
_UNSAFE_TARGET = re.compile(r"[ \r\n\t]")
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
_LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
CROSSED_CLOSE_S = 1.0
"""A reused connection lost within this long of the send, with nothing back, crossed the server's idle close."""


class ConnectFailed(OSError):
    """The connection could not be opened; nothing reached the upstream."""


class ConnectionReset(ConnectionError):
    """The connection closed, reset, or carried a malformed response after the request was sent."""


class LocalResourceError(OSError):
    """No connection could be opened for want of a local resource (file descriptors, buffers, memory)."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int
    host_header: str
    authorization: str | None = None
    """``Basic …`` from credentials in the URL (``http://user:password@host``), sent unless the request has its own."""

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def split_url(url: str) -> tuple[Origin, str]:
    """``(origin, request target)`` of an absolute ``http(s)://`` URL; ``ValueError`` for anything else."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError("not an http(s) URL")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, target = rest[:cut], rest[cut:]
    target = target if target.startswith("/") else "/" + target
    userinfo, at, authority = authority.rpartition("@")
    authorization = None
    if at:
        credentials = ":".join(unquote(part) for part in userinfo.split(":", 1))
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode()
    if not authority or any(c in target for c in " \r\n\t"):
        raise ValueError("not a forwardable URL")  # (the URL is not quoted: it may hold credentials)
    default = 443 if scheme == "https" else 80
    if authority.startswith("["):  # an IPv6 literal: [::1]:8000
        end = authority.find("]")
        host, port_text = authority[1:end], authority[end + 2:]
    else:
        host, _, port_text = authority.partition(":")
    port = int(port_text) if port_text else default
    host_header = authority if port_text and port != default else authority.rsplit(":", 1)[0] \
        if port_text else authority
    return Origin(scheme, host, port, host_header, authorization), target


class Response:
    """One upstream response: status and headers at once, the body complete (:meth:`read`) or in pieces
    (:meth:`iter_chunks`); then :meth:`release` (reuse the connection if possible) or :meth:`close`."""

    def __init__(self, connection: _Connection, head_only: bool) -> None:
        self._connection = connection
        self._head_only = head_only
        self.status = 0
        self.raw_headers: list[tuple[str, str]] = []
        """The response's header pairs as received (names as sent)."""
        self.content_type = ""
        """The media type, lower-cased, without parameters ("" when absent)."""
        self.content_encoding = ""
        self.decoded = False
        self._headers: CIMultiDict[str] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._whole = False  # read() wants the whole body: no backpressure
        self._until_close = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: zlib._Decompress | None = None

    @property
    def headers(self) -> CIMultiDict[str]:
        """The headers for lookups (built on first use)."""
        if self._headers is None:
            self._headers = CIMultiDict(self.raw_headers)
        return self._headers

    @property
    def complete(self) -> bool:
        return self._done and self._error is None

    # -- fed by the connection --

    def _on_head(self, status: int) -> None:
        self.status = status
        length = False
        transfer = ""
        for name, value in self.raw_headers:  # one pass for the four headers the client itself needs
            lower = name.lower()
            if lower == "content-type":
                self.content_type = value.partition(";")[0].strip().lower()
            elif lower == "content-length":
                length = True
            elif lower == "content-encoding":
                self.content_encoding = value
            elif lower == "transfer-encoding":
                transfer = value
        encoding = self.content_encoding.strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47 if encoding != "deflate" else zlib.MAX_WBITS)
            self.decoded = True
        no_body = self._head_only or status in _NO_BODY_STATUSES
        if not no_body and not length and "chunked" not in transfer.lower():
            self._until_close = True  # the body ends when the server closes the connection
        if no_body and self._head_only:
            self._done = True
        self._wake()

    def _on_body(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as exc:
                self._fail(ConnectionReset(f"undecodable {self.content_encoding} body: {exc}"))
                return
        if not data:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._whole:
            self._connection.pause()
        self._wake()

    def _on_complete(self) -> None:
        if self._decoder is not None:
            tail = self._decoder.flush()
            if tail:
                self._chunks.append(tail)
        self._done = True
        self._wake()

    def _on_lost(self, exc: BaseException | None) -> None:
        if self._done:
            return
        if self._until_close and self.status:
            self._on_complete()
            return
        self._fail(ConnectionReset(f"the connection closed {'mid-body' if self.status else 'before a response'}"
                                   + (f" ({exc.__class__.__name__})" if exc else "")))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = exc
            self._done = True
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, silence_s: float) -> None:
        waiter = self._waiter = self._connection.loop.create_future()
        self._connection.watch(silence_s)
        await waiter

    # -- used by the caller --

    async def wait_head(self, silence_s: float) -> None:
        while not self.status and self._error is None:
            await self._wait(silence_s)
        if self._error is not None:
            raise self._error

    async def iter_chunks(self, silence_s: float) -> AsyncIterator[bytes]:
        """The body as it arrives; raises :class:`ConnectionReset` or :class:`TimeoutError` if it breaks off."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered < LOW_WATER and self._connection.paused:
                    self._connection.resume()
                yield chunk
            elif self._error is not None:
                raise self._error
            elif self._done:
                return
            else:
                await self._wait(silence_s)

    async def read(self, silence_s: float) -> bytes:
        """The whole body."""
        self._whole = True
        if self._connection.paused:
            self._connection.resume()
        while not self._done:
            await self._wait(silence_s)
        if self._error is not None:
            raise self._error
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return body

    def release(self) -> None:
        """Back to the pool when the response ended cleanly with keep-alive; closed otherwise."""
        self._connection.finish(self, reusable=self.complete and not self._until_close and not self._head_only)

    def close(self) -> None:
        self._connection.finish(self, reusable=False)


class _Connection(asyncio.Protocol):
    """One TCP connection carrying one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()  # kept: each lookup is a getpid() system call
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self.keep_alive = True
        self.informational = False
        self.idle_since = 0.0
        self.reused = False  # it carried an earlier response
        self.silent = True  # nothing came back yet for the request in flight
        self.sent_at = 0.0
        self._head_bytes = 0  # raw bytes received while the response head is incomplete
        self._field_bytes = 0  # the complete header fields' sizes
        self._deadline = 0.0  # when the consumer waiting for the response gives up on the upstream's silence
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = 0.0

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes while idle: the server is out of step; never reuse this connection
            self.close()
            return
        self.silent = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(ConnectionReset(f"malformed response: {exc}"))
            self.close()
            return
        if not response.status:  # the head is still arriving: llhttp holds a partial field, so bound the bytes
            self._head_bytes += len(data)
            if self._head_bytes > self.pool.client.max_head:
                self._head_too_large(response)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self.response is not None:
            self.response._on_lost(exc)
        self.pool.gone(self)

    # -- httptools callbacks --

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self._field_bytes += len(name) + len(value)
        self.response.raw_headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        assert self.response is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # informational (103 Early Hints, ...): the final response follows
            self.informational = True
            self.response.raw_headers.clear()
            return
        if self._field_bytes > self.pool.client.max_head:
            self._head_too_large(self.response)
            return
        self.keep_alive = self.parser.should_keep_alive()
        self.response._on_head(status)

    def _head_too_large(self, response: Response) -> None:
        response._fail(ConnectionReset(f"malformed response: the head exceeds {self.pool.client.max_head} bytes"))
        self.close()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._on_body(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        if self.informational:
            self.informational = False
            return
        self.idle_since = time.monotonic()  # the server's keep-alive timer starts as it sends the last byte
        self.response._on_complete()

    # -- used by the pool and the response --

    def send(self, head: bytes, body: bytes | None, head_only: bool) -> Response:
        assert self.transport is not None
        response = self.response = Response(self, head_only)
        self._head_bytes = self._field_bytes = 0
        self.silent = True
        self.sent_at = time.monotonic()
        if body and len(body) > 16 * 1024:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head + body if body else head)
        return response

    def watch(self, silence_s: float) -> None:
        """The response's consumer starts waiting: fail the wait after ``silence_s`` seconds without news.

        One timer per connection, not one per wait: it stays armed from wait to wait (a request waits at least
        twice, for the head and for the body) and, when it fires, re-arms for whatever is left of the current
        wait, or lapses when nobody is waiting."""
        deadline = self._deadline = time.monotonic() + silence_s
        if self._watch is None or self._watch_at > deadline:
            if self._watch is not None:
                self._watch.cancel()
            self._watch_at = deadline
            self._watch = self.loop.call_later(silence_s, self._check_silence)

    def _check_silence(self) -> None:
        self._watch = None
        response = self.response
        waiter = response._waiter if response is not None else None
        if waiter is None or waiter.done():
            return
        left = self._deadline - time.monotonic()
        if left > 0:
            self._watch_at = self._deadline
            self._watch = self.loop.call_later(left, self._check_silence)
        else:
            waiter.set_exception(TimeoutError())

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def finish(self, response: Response, *, reusable: bool) -> None:
        if self.response is not response:
            return
        self.response = None
        if reusable and self.keep_alive and not self.closed and not self.paused:  # llhttp parses the next one
            self.reused = True
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.pool.gone(self)


class _Pool:
    """The connections to one origin."""

    def __init__(self, origin: Origin, client: Http1Client) -> None:
        self.origin = origin
        self.client = client
        self.idle: list[_Connection] = []
        self.open: set[_Connection] = set()
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self, *, fresh: bool = False) -> _Connection:
        """An idle connection, or a new one (``fresh``: always a new one)."""
        while True:
            now = time.monotonic()
            while self.idle and fresh:  # make room: these may be as stale as the one that failed
                self.idle.pop().close()
            while self.idle:
                connection = self.idle.pop()
                transport = connection.transport
                if connection.closed or transport is None or transport.is_closing() \
                        or now - connection.idle_since > self.client.idle_s:
                    connection.close()
                    continue
                return connection
            if len(self.open) < self.client.limit:
                return await self._connect()
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = _Connection(self)
        self.open.add(connection)
        origin = self.origin
        try:
            async with asyncio.timeout(self.client.connect_timeout):
                await loop.create_connection(
                    lambda: connection, origin.host, origin.port,
                    ssl=self.client.ssl_context() if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
        except TimeoutError:
            self.gone(connection)
            raise ConnectFailed(f"connect timed out after {self.client.connect_timeout:g}s") from None
        except OSError as exc:
            self.gone(connection)
            if exc.errno in _LOCAL_ERRNOS:
                raise LocalResourceError(exc.errno, f"no connection opened: {exc.strerror}") from None
            raise ConnectFailed(exc.errno, exc.strerror or exc.__class__.__name__) from None
        except BaseException:
            self.gone(connection)
            raise
        return connection

    def put(self, connection: _Connection) -> None:
        self.idle.append(connection)
        self._wake_one()

    def gone(self, connection: _Connection) -> None:
        if connection in self.open:
            self.open.discard(connection)
            self._wake_one()

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for connection in list(self.open):
            connection.close()
        self.idle.clear()


class Http1Client:
    """Pooled HTTP/1.1 requests to any number of origins."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, limit: int = 100, idle_s: float = 4.0,
                 ssl_context: ssl.SSLContext | None = None, max_head: int = 64 * 1024) -> None:
        self.connect_timeout = connect_timeout
        self.max_head = max_head
        self.read_timeout = read_timeout
        self.limit = limit
        self.idle_s = idle_s
        self._ssl = ssl_context
        self._pools: dict[str, tuple[_Pool, str]] = {}

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _pool(self, url: str) -> tuple[_Pool, str]:
        """The pool of ``url``'s origin and the request target (origins are parsed once)."""
        scheme_end = url.find("://") + 3
        slash = url.find("/", scheme_end)
        base = url if slash < 0 else url[:slash]
        cached = self._pools.get(base)
        if cached is None:
            origin, _ = split_url(base)
            cached = self._pools[base] = (_Pool(origin, self), origin.host_header)
        target = "/" if slash < 0 else url[slash:]
        if _UNSAFE_TARGET.search(target):
            raise ValueError(f"not a forwardable request target: {target!r}")
        return cached[0], target

    async def request(self, method: str, url: str, headers: Headers, body: bytes | None, *,
                      idempotent: bool | None = None) -> Response:
        """Send a request and wait for the response head (the body is read from the :class:`Response`).

        This is the transport boundary: every outbound HTTP call of the proxy passes here. Raises
        :class:`ConnectFailed` (safe to retry), :class:`ConnectionReset`, :class:`TimeoutError`,
        :class:`LocalResourceError`, or ``ValueError`` for a URL or header that cannot be sent.

        A request whose pooled connection is lost before any byte of an answer comes back is sent once more, on a
        new connection, when it is idempotent (``idempotent``, default: by method) or, whatever its method, when
        the loss came within :data:`CROSSED_CLOSE_S` of the send. That is the keep-alive race: the server's idle
        timer closed the connection (cpp-httplib and uvicorn after 5 s) while the request was on its way, or before
        this busy process had read the close. The server closed it without reading the request, so it never
        processed it, and sending it again on a new connection is safe. (A server that did read it and died within
        that second without a byte is sent it again too: its answer was lost, and a dead server refuses the new
        connection.) Nothing is resent after a response byte, after a timeout, when the loss came later than that,
        or when the connection was a new one: that is a server failing rather than racing, possibly after it worked
        on the request.
        """
        pool, target = self._pool(url)
        head = _request_head(method, target, pool.origin, headers, body)
        head_only = method == "HEAD"
        connection = await pool.acquire()
        fresh = False
        while True:
            response = connection.send(head, body, head_only)
            try:
                await response.wait_head(self.read_timeout)
            except ConnectionReset:
                response.close()
                if fresh or not (connection.reused and connection.silent) or not (
                        (method in _IDEMPOTENT if idempotent is None else idempotent)
                        or time.monotonic() - connection.sent_at <= CROSSED_CLOSE_S):
                    raise
                fresh = True  # the server closed the pooled connection as the request went out: once more
                connection = await pool.acquire(fresh=True)
                continue
            except BaseException:
                response.close()
                raise
            return response

    async def close(self) -> None:
        for pool, _ in self._pools.values():
            pool.close()
        self._pools.clear()


_NOT_FORWARDED = frozenset({"content-length", "transfer-encoding"})  # the body is sent with its own length
_DEFAULTED = frozenset({"host", "accept", "authorization"})  # sent by the client itself unless the request has them


def _request_head(method: str, target: str, origin: Origin, headers: Headers, body: bytes | None) -> bytes:
    pairs = headers if isinstance(headers, list) else headers.items() if isinstance(headers, Mapping) else headers
    lines = [f"{method} {target} HTTP/1.1\r\n", ""]  # [1]: Host, unless the request has one
    present: set[str] = set()
    for name, value in pairs:
        lower = name.lower()
        if lower in _NOT_FORWARDED:
            continue
        if lower in _DEFAULTED:
            present.add(lower)
        if ":" in name:
            raise ValueError(f"header {name!r} cannot be sent")
        lines.append(f"{name}: {value}\r\n")
    if "host" not in present:
        lines[1] = f"Host: {origin.host_header}\r\n"
    if origin.authorization and "authorization" not in present:
        lines.append(f"Authorization: {origin.authorization}\r\n")
    if "accept" not in present:
        lines.append("Accept: */*\r\n")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body) if body else 0}\r\n")
    lines.append("\r\n")
    text = "".join(lines)
    # every line ends in the one CR LF put there above: any other is a name or value trying to add a line
    expected = len(lines) - (lines[1] == "")
    if text.count("\r") != expected or text.count("\n") != expected:
        bad = next((n for n, v in pairs if "\r" in n + v or "\n" in n + v), "?")
        raise ValueError(f"header {bad!r} cannot be sent")
    return text.encode("utf-8", "surrogateescape")
