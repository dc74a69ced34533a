"""The data plane's HTTP/1.1 server: one :class:`Connection` protocol per client, run by :class:`HttpServer`.

Why not aiohttp's server: per request it builds a request object with lazy URL parsing, a stream reader for the
body, a response object and its payload writer, and runs them through a chain of coroutines; on this stack that
cost about as much CPU as the proxy's whole pass-through pipeline (``python -m loadtest.bench overhead``: the
``floor_*`` figures are a bare forwarder on this server; BENCHMARKS.md). The data plane needs a narrow part of
HTTP/1.1 — read a request with a body of bounded size, write a complete or streamed response, keep the
connection — so this module does that and leaves the parsing (framing, chunked bodies, keep-alive rules,
malformed input) to httptools, the llhttp binding uvicorn uses. The admin API stays an aiohttp application.

Semantics:

* Bodies are read whole before the handler runs, up to ``max_body`` bytes. A larger one — declared or found
  while reading a chunked body — reaches the handler at once as ``body_too_large`` (it answers 413); the rest is
  read and dropped for up to ``LINGER_S`` seconds so the client gets the answer, then the connection closes.
* ``Expect: 100-continue`` is answered with ``100 Continue`` (or straight away with the handler's 413).
* Requests are answered in order; pipelined ones queue (reading pauses past ``MAX_QUEUED``).
* A client that hangs up (or half-closes) cancels its request's handler; writes then raise
  :class:`ConnectionResetError`.
* An ``Upgrade`` request is served as plain HTTP and the connection then closes.
* Malformed requests get a 400 (a head over ``max_head`` bytes a 431, counted while it arrives) with a JSON body
  from ``error_body``; the server then ends its side and drops what the client still sends for up to ``LINGER_S``
  seconds before closing, so the answer is not lost to a reset. An exception that escapes the handler is logged
  and answered with a 500.
* A client that falls silent for ``read_timeout_s`` in the middle of sending a request gets a 408 and the
  connection closes (a request trickled in forever would otherwise hold its connection for good).
* A request head must be complete within ``head_timeout_s`` of its first byte, however steadily it trickles in
  (slowloris), and a new connection's first head within ``head_timeout_s`` of connecting: a 408 (or, when nothing
  came at all, a plain close) otherwise. Its body must then be complete within ``body_timeout_s`` of the head,
  however steadily it trickles in: a 408 otherwise (a body sent one byte a minute would hold its connection, and
  the bytes received so far, for good).
* At most ``max_connections`` connections, and at most 3/4 of the process's open-file limit (the rest is for
  upstream connections, Redis and files): past it, a new connection closes the one idle the longest (no request
  being answered: keep-alive, or a request still arriving); with none idle, it gets a 503 and is closed. So a
  flood of idle connections cannot exhaust the descriptors, and a health check still gets through.
* Idle keep-alive connections close after ``keepalive_s``. :meth:`HttpServer.shutdown` stops listening, closes
  idle connections, lets in-flight requests finish within the grace period and cancels what is left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.server.request import Request
from proxy.server.responder import Responder

READ_TIMEOUT_S, HEAD_TIMEOUT_S, BODY_TIMEOUT_S = 60.0, 10.0, 60.0
"""How long a client may take, unless configured (``server.*_timeout_s``: see the settings for what each bounds)."""
MAX_CONNECTIONS = 10_000
"""Client connections per process unless configured (``server.max_connections``)."""

log = logging.getLogger("ragproxy.server")

Handler = Callable[[Request, Responder], Awaitable[None]]
ErrorBody = Callable[[str, int, str, str], bytes]
"""``(path, status, message, code) -> JSON body`` for errors the server answers itself."""

LINGER_S = 2.0
MAX_QUEUED = 16
_JSON = (("Content-Type", "application/json"),)


class _Reject(Exception):
    """Raised from a parser callback: answer ``status`` and close."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class HttpServer:
    """Listens on one address and serves every connection with ``handler``."""

    def __init__(self, handler: Handler, *, max_body: int, error_body: ErrorBody, max_head: int = 64 * 1024,
                 keepalive_s: float = 75.0, read_timeout_s: float = READ_TIMEOUT_S,
                 head_timeout_s: float = HEAD_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.handler = handler
        self.max_body = max_body
        self.max_head = max_head
        self.keepalive_s = keepalive_s
        self.read_timeout_s = read_timeout_s
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.error_body = error_body
        self.connections: set[Connection] = set()
        self._shed_order: list[tuple[float, Connection]] = []  # idle connections, the one idle the longest last
        self.shutting_down = False
        self._servers: list[asyncio.AbstractServer] = []
        self._all_closed = asyncio.Event()

    def cap(self) -> int:
        """``max_connections``, and at most 3/4 of the open-file limit as it is now (read at each new connection, not
        per request: the limit of a running process can be lowered from outside, e.g. ``prlimit``)."""
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if open_files == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, open_files * 3 // 4))

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_server(lambda: Connection(self), host, port, reuse_address=True,
                                                      backlog=1024))

    async def shutdown(self, grace_s: float) -> None:
        """Stop listening; let requests in flight finish within ``grace_s`` seconds; close everything."""
        self.shutting_down = True
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), grace_s)
        handlers = [task for connection in self.connections if (task := connection.task) is not None]
        for connection in list(self.connections):
            connection.abort()
        if handlers:  # let the cancelled handlers run their cleanup
            await asyncio.wait(handlers, timeout=1.0)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def admit(self) -> bool:
        """Make room for a new connection past the cap by closing the one idle the longest; ``False``: none is.

        Nothing is tracked per request: past the cap the idle connections are sorted once by how long they have
        been idle, and that order serves the next connections too (an entry whose connection was used since, or
        closed, is skipped), so a flood of new connections costs O(log n) each."""
        if len(self.connections) < self.cap():
            return True
        while True:
            if not self._shed_order:
                idle = sorted((c for c in self.connections if c.idle), key=lambda c: c.idle_since, reverse=True)
                if not idle:
                    return False
                self._shed_order = [(c.idle_since, c) for c in idle]
            since, oldest = self._shed_order.pop()
            if oldest.idle and oldest.idle_since == since:
                oldest.abort()
                return True

    def forget(self, connection: Connection) -> None:
        """``connection`` is closed."""
        self.connections.discard(connection)
        if self.shutting_down and not self.connections:
            self._all_closed.set()


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler for one at a time, writes the answers."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()  # kept: each lookup is a getpid() system call
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.closing = False
        self._url: list[bytes] = []
        self._headers: list[tuple[str, str]] = []
        self._in_head = False
        self._body: list[bytes] = []
        self._size = 0
        self._head_bytes = 0  # raw bytes received while the head is incomplete
        self._field_bytes = 0  # the complete fields' sizes (target, names, values)
        self._dispatched = False  # the current message went to the handler before its body was read
        self._message_done = True
        self._queue: collections.deque[tuple[Request, Responder] | _Reject] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._head_since: float | None = None  # when the head now due began (None: no head due)
        self._body_since: float | None = None  # when the head of a request whose body is still arriving ended
        self._last_read = 0.0  # when bytes of a request still arriving last came
        self._lingering: asyncio.TimerHandle | None = None
        self._write_paused: asyncio.Future[None] | None = None
        self._read_paused = False
        self._close_when_idle = False
        self._broken = False  # a malformed request was seen: nothing after it is parsed

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else None
        if not self.server.admit():  # every other connection is busy: say so and close
            self._error_response(503, "the proxy has too many connections; retry shortly", "too_many_connections")
            self._shut()
            return
        self.server.connections.add(self)
        self._arm_idle()
        self._head_since = self._idle_since

    def data_received(self, data: bytes) -> None:
        if self._broken or (self._lingering is not None and self._message_done):
            return
        try:
            self.parser.feed_data(data)
            if not self._message_done:  # a request still arriving (most come whole, in one piece)
                self._last_read = time.monotonic()
                if self._in_head:  # llhttp holds a partial field: bound what the head may take
                    if self._head_since is None:
                        self._head_since = self._last_read
                    self._head_bytes += len(data)
                    if self._head_bytes > self.server.max_head:
                        self._enqueue(self._head_too_large())
                elif self._body_since is None:  # the head ended in this piece; the body's deadline runs
                    self._body_since = self._last_read
        except httptools.HttpParserUpgrade:  # served as plain HTTP (Upgrade ignored); what follows is not parsed
            self._broken = True
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._enqueue(cause if isinstance(cause, _Reject) else _Reject(400, "malformed request", "bad_request"))
        except httptools.HttpParserError as exc:
            self._enqueue(_Reject(400, f"malformed request: {exc}", "bad_request"))

    def eof_received(self) -> bool:
        return False  # the client hung up: close (connection_lost cancels a request in flight)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.forget(self)
        for handle in (self._idle, self._lingering):
            if handle is not None:
                handle.cancel()
        if self._task is not None:
            self._task.cancel()
        self._queue.clear()
        waiter = self._write_paused
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        waiter, self._write_paused = self._write_paused, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- httptools callbacks --

    def on_message_begin(self) -> None:
        self._message_done = False
        self._dispatched = False
        self._url.clear()
        self._headers = []
        self._body = []
        self._size = 0
        self._head_bytes = 0
        self._field_bytes = 0
        self._in_head = True
        self._body_since = None

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._field_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._field_bytes += len(name) + len(value)
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_since = None
        if self._field_bytes > self.server.max_head:
            raise self._head_too_large()
        declared = expect = None
        for name, value in self._headers:
            lower = name.lower()
            if lower == "content-length":
                declared = value
            elif lower == "expect":
                expect = value
        length = int(declared) if declared is not None and declared.isdigit() else None  # llhttp checked it
        if length is not None and length > self.server.max_body:
            self._dispatch(body_too_large=True)
            return
        if expect is not None and expect.lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._dispatched:
            return
        self._size += len(body)
        if self._size > self.server.max_body:
            self._body = []
            self._dispatch(body_too_large=True)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._message_done = True
        if self._lingering is not None:
            self._close()
        elif not self._dispatched:
            self._dispatch(body_too_large=False)

    # -- requests --

    def _head_too_large(self) -> _Reject:
        return _Reject(431, f"the request head exceeds {self.server.max_head} bytes", "request_header_fields_too_large")

    def _dispatch(self, *, body_too_large: bool) -> None:
        self._dispatched = True
        parser = self.parser
        method = parser.get_method().decode("ascii", "replace")
        body = b"" if body_too_large else (self._body[0] if len(self._body) == 1 else b"".join(self._body))
        request = Request(method, b"".join(self._url).decode("utf-8", "surrogateescape"),
                          CIMultiDictProxy(CIMultiDict(self._headers)), body, peer=self.peer,
                          body_too_large=body_too_large)
        keep_alive = (parser.should_keep_alive() and not parser.should_upgrade() and not body_too_large
                      and not self.server.shutting_down)
        responder = Responder(self, head_only=method == "HEAD", http10=parser.get_http_version() == "1.0",
                              keep_alive=keep_alive)
        self._enqueue((request, responder))

    def _enqueue(self, item: tuple[Request, Responder] | _Reject) -> None:
        if isinstance(item, _Reject):
            self._broken = True
        self._queue.append(item)
        if self._task is None:
            self._next()
        elif len(self._queue) > MAX_QUEUED and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def _next(self) -> None:
        if self.closing:
            return
        if not self._queue:
            if self._close_when_idle:
                self._close()
            else:
                self._arm_idle()
            return
        if self._read_paused and len(self._queue) <= MAX_QUEUED // 2 and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        item = self._queue.popleft()
        if isinstance(item, _Reject):  # the byte stream is out of step: answer and close, parse nothing more
            self._queue.clear()
            self._error_response(item.status, str(item), item.code)
            self._linger()
            return
        self._task = self.loop.create_task(self._run(*item))

    async def _run(self, request: Request, responder: Responder) -> None:
        try:
            await self.server.handler(request, responder)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
        finally:
            self._task = None
        if not responder.started:
            log.error("no response to %s %s", request.method, request.path)
            self._error_response(500, "internal proxy error", "internal_error", request.path)
            self._close()
        elif not responder.finished or not responder.keep_alive:
            self._close()
        else:
            self._next()

    def _error_response(self, status: int, message: str, code: str, path: str = "") -> None:
        """Answer an error the server found itself (JSON from ``error_body``); the connection then closes."""
        if self.closing:
            return
        if not path and self._url:
            path = b"".join(self._url).decode("utf-8", "replace").partition("?")[0]
        body = self.server.error_body(path, status, message, code)
        Responder(self, head_only=False, http10=False, keep_alive=False).send(status, _JSON, body)

    # -- writing and closing (the responder's channel) --

    def write(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        if self.closing:
            raise ConnectionResetError("the client closed the connection")
        waiter = self._write_paused
        if waiter is not None:
            await asyncio.shield(waiter)

    def _arm_idle(self) -> None:
        """Note that the connection went idle; the one timer (not one per request) checks it later: for the
        keep-alive limit, or for the client's pace if a request is arriving by then."""
        self._idle_since = time.monotonic()
        if self._idle is None:
            server = self.server
            self._idle = self.loop.call_later(min(server.keepalive_s, server.read_timeout_s, server.head_timeout_s,
                                                  server.body_timeout_s), self._check_idle)

    def _check_idle(self) -> None:
        self._idle = None
        if self.closing or self._task is not None or self._queue or self._broken or self._lingering is not None:
            return  # a request is being answered (the timer is armed again once it is), or the connection ends
        server = self.server
        now = time.monotonic()
        if self._head_since is not None and now - self._head_since >= server.head_timeout_s:
            if self._message_done:  # a new connection that sent nothing
                self._close()
            else:
                self._enqueue(_Reject(408, f"the request head took over {server.head_timeout_s:g}s",
                                      "request_timeout"))
            return
        if not self._message_done:  # a request is arriving
            left = max(self._last_read, self._idle_since) + server.read_timeout_s - now
            if left <= 0:
                self._enqueue(_Reject(408, f"no request bytes for {server.read_timeout_s:g}s", "request_timeout"))
                return
            if self._body_since is not None and not self._in_head:
                body_left = self._body_since + server.body_timeout_s - now
                if body_left <= 0:
                    self._enqueue(_Reject(408, f"the request body took over {server.body_timeout_s:g}s",
                                          "request_timeout"))
                    return
                left = min(left, body_left)
        else:
            left = self._idle_since + server.keepalive_s - now
            if left <= 0:
                self._close()
                return
        if self._head_since is not None:
            left = min(left, self._head_since + server.head_timeout_s - now)
        self._idle = self.loop.call_later(min(left, server.read_timeout_s), self._check_idle)

    def _close(self) -> None:
        """Close after what was written; a request whose body is still arriving is read and dropped first."""
        if self.closing or self.transport is None:
            return
        if not self._message_done and self._lingering is None:
            self._lingering = self.loop.call_later(LINGER_S, self.abort)
            if self._read_paused:
                self.transport.resume_reading()
            return
        self._shut()

    def _linger(self) -> None:
        """End our side after an error answer and drop what the client is still sending, for up to ``LINGER_S``
        seconds: closing with unread bytes would reset the connection, and a reset can destroy the answer before
        the client reads it."""
        if self.closing or self.transport is None:
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._lingering is None:
            self._lingering = self.loop.call_later(LINGER_S, self.abort)

    def _shut(self) -> None:
        if not self.closing and self.transport is not None:
            self.closing = True
            self.transport.close()

    def close_when_idle(self) -> None:
        """Shutdown: close now if idle, else once the request in flight is answered."""
        self._close_when_idle = True
        if self._task is None and not self._queue and self._message_done:  # a request arriving is still served
            self._close()

    @property
    def idle(self) -> bool:
        """Answering nothing (keep-alive, or a request still arriving), and not closing."""
        return self._task is None and not self._queue and not self.closing and self._lingering is None

    @property
    def idle_since(self) -> float:
        """When it last went idle: connected, or answered its last request."""
        return self._idle_since

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The handler answering the current request, if any."""
        return self._task

    def abort(self) -> None:
        """Close at once, dropping what is unsent; the handler in flight is cancelled."""
        if self.transport is not None:
            self.transport.abort()
        self.closing = True
        self.server.forget(self)
        if self._task is not None:
            self._task.cancel()

