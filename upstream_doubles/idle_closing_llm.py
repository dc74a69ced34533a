"""IdleClosingLLM: a test double of an inference server's HTTP/1.1 keep-alive, as cpp-httplib (llama-server) and
uvicorn (vLLM, SGLang) run it: each connection carries requests one after another and is closed once it has been
idle for ``idle_s`` (5 s on those servers), or after ``max_requests`` answers, the last one saying
``Connection: close`` (cpp-httplib's keep-alive count).

Two ways to close an idle connection:

- ``crossing=False``: a timer closes it ``idle_s`` after its last answer, as the servers do. A client whose event
  loop reads the close before its next request never meets it.
- ``crossing=True`` (the default): the close crosses the client's next request. A request arriving on a connection
  idle for ``idle_s`` or more is not read as a request: the connection is closed, unanswered, as the server's timer
  would have closed it while the request was on its way or while a busy client had not yet read the close. Every
  such request is counted in ``crossed``; it was never processed (``answered`` does not count it).

Routes: ``POST /v1/chat/completions`` (streamed with chunked SSE when ``stream`` is true, the usage chunk when
``stream_options.include_usage``), ``GET /v1/models`` (the health probe's path); anything else answers 404. Bodies
follow :mod:`upstream_doubles.openai_shapes`; answers come after ``latency_s``.

On the caller's event loop (``async with IdleClosingLLM(idle_s=0.2) as llm: ...``) or on a thread of its own
(``with IdleClosingLLM(idle_s=0.2) as llm: ...``, for a proxy started from the same loop).
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any, Self

import httptools
import orjson

from upstream_doubles import openai_shapes as shapes


class IdleClosingLLM:
    """The server: counters ``connections``, ``answered``, ``crossed`` (requests met with a close) and
    ``idle_closed`` (connections its timer closed)."""

    def __init__(
        self,
        *,
        idle_s: float = 0.2,
        crossing: bool = True,
        max_requests: int = 100,
        latency_s: float = 0.0,
        model: str = "idle-closing",
    ) -> None:
        self.idle_s = idle_s
        self.crossing = crossing
        self.max_requests = max_requests
        self.latency_s = latency_s
        self.model = model
        self.connections = 0
        self.answered = 0
        self.crossed = 0
        self.idle_closed = 0
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("server is not running")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def __enter__(self) -> Self:
        ready = threading.Event()
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="IdleClosingLLM", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools, answered in turn."""

    def __init__(self, server: IdleClosingLLM) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.served = 0
        self.idle_since: float | None = None  # None: never answered, or an answer is under way
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.idle_since is not None and time.monotonic() - self.idle_since >= self.server.idle_s:
            self.server.crossed += 1  # the idle close and this request crossed: it is never read
            self._close()
            return
        self.idle_since = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()

    # -- httptools callbacks --

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        path = self.url.decode().partition("?")[0]
        body = b"".join(self.body)
        self.url, self.body = b"", []
        asyncio.get_running_loop().create_task(self._answer(method, path, body))

    # -- answers --

    async def _answer(self, method: str, path: str, body: bytes) -> None:
        if self.server.latency_s > 0:
            await asyncio.sleep(self.server.latency_s)
        if self.closed:
            return
        self.served += 1
        last = self.served >= self.server.max_requests
        if method == "POST" and path == "/v1/chat/completions":
            request = orjson.loads(body or b"{}")
            prompt = shapes.prompt_of_messages(request.get("messages") or [])
            pieces, finish = shapes.split_answer(shapes.default_answer(prompt), None)
            use = shapes.usage(shapes.count_tokens(prompt), len(pieces))
            if request.get("stream"):
                include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                await self._stream(pieces, finish, use if include_usage else None, last)
            else:
                answer = shapes.chat_completion(
                    shapes.new_id("chatcmpl"), self.server.model, "".join(pieces), finish, use
                )
                self._whole(200, answer, last)
        elif method == "GET" and path == "/v1/models":
            self._whole(200, shapes.model_list([self.server.model]), last)
        else:
            self._whole(404, shapes.error_body(f"no route {method} {path}", "not_found_error"), last)
        self.server.answered += 1
        self._idle(last)

    def _head(self, status: int, content_type: str, last: bool, length: int | None) -> bytes:
        framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        connection = "close" if last else "keep-alive"
        return (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\nContent-Type: {content_type}\r\n"
            f"{framing}\r\nConnection: {connection}\r\n\r\n"
        ).encode()

    def _whole(self, status: int, payload: Any, last: bool) -> None:
        assert self.transport is not None
        data = orjson.dumps(payload)
        self.transport.write(self._head(status, "application/json", last, len(data)) + data)

    async def _stream(self, pieces: list[str], finish: str, use: dict[str, Any] | None, last: bool) -> None:
        assert self.transport is not None
        completion_id, created = shapes.new_id("chatcmpl"), int(time.time())
        events = [shapes.chat_chunk(completion_id, self.server.model, created, {"role": "assistant", "content": ""})]
        events += [shapes.chat_chunk(completion_id, self.server.model, created, {"content": p}) for p in pieces]
        events.append(shapes.chat_chunk(completion_id, self.server.model, created, {}, finish))
        if use is not None:
            events.append(shapes.chat_chunk(completion_id, self.server.model, created, None, use=use))
        payloads = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events] + [b"data: [DONE]\n\n"]
        self.transport.write(self._head(200, "text/event-stream", last, None))
        for payload in payloads:
            await asyncio.sleep(0)  # one event at a time, as a server generating them would
            if self.closed:
                return
            self.transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.transport.write(b"0\r\n\r\n")

    def _idle(self, last: bool) -> None:
        if last:
            self._close()
            return
        self.idle_since = time.monotonic()
        if not self.server.crossing:
            self.timer = asyncio.get_running_loop().call_later(self.server.idle_s, self._idle_timeout)

    def _idle_timeout(self) -> None:
        self.timer = None
        if self.idle_since is not None and not self.closed:
            self.server.idle_closed += 1
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
