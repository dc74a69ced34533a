"""The data plane's HTTP/1.1 server (:mod:`proxy.server`) on the wire: framing, keep-alive, limits, errors,
flow control and shutdown, driven over raw sockets so every byte is visible."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from proxy.server.connection import HttpServer
from proxy.server.request import Request
from proxy.server.responder import Responder
from tests.support.processes import free_port

JSON = [("Content-Type", "application/json")]
Handler = Callable[[Request, Responder], Awaitable[None]]


def error_body(path: str, status: int, message: str, code: str) -> bytes:
    return orjson.dumps({"path": path, "status": status, "message": message, "code": code})


async def echo(request: Request, out: Responder) -> None:
    out.send(200, JSON, orjson.dumps({"method": request.method, "path": request.path, "raw": request.raw_path,
                                      "body": request.body.decode(), "too_large": request.body_too_large}))


def answer_when(release: asyncio.Event) -> Handler:
    """A handler that answers each request once ``release`` is set."""
    async def answer(request: Request, out: Responder) -> None:
        await release.wait()
        out.send(200, JSON, b"{}")
    return answer


class Served:
    def __init__(self, server: HttpServer, port: int) -> None:
        self.server = server
        self.port = port

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    started: list[HttpServer] = []

    async def start(handler: Handler = echo, **options: object) -> Served:
        server = HttpServer(handler, error_body=error_body, **{"max_body": 1024, **options})  # type: ignore[arg-type]
        port = free_port()
        await server.start("127.0.0.1", port)
        started.append(server)
        return Served(server, port)

    yield start
    for server in started:
        await server.shutdown(1.0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-cased names), body (by Content-Length or chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, headers, body
            body += chunk[:-2]
    return status, headers, await reader.read()


async def trickled(served: Served, start: bytes) -> tuple[int, bytes, float]:
    """Send ``start``, then one byte every 0.1 s (never silent for a read timeout) until the server answers: its
    status, body, and the seconds it took."""
    reader, writer = await served.connect()
    loop = asyncio.get_running_loop()
    writer.write(start)
    started = loop.time()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.1)
                writer.write(b"x")

    trickling = asyncio.create_task(trickle())
    status, _, body = await read_response(reader)
    trickling.cancel()
    writer.close()
    return status, body, loop.time() - started


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%b\r\n%b" % (path.encode(), len(body), extra, body)


async def test_keep_alive_serves_pipelined_requests_in_order(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"".join(post(f"/r{i}", b"x" * i) for i in range(5)))
    for i in range(5):
        status, headers, body = await read_response(reader)
        assert status == 200 and "connection" not in headers and "date" in headers
        assert orjson.loads(body)["path"] == f"/r{i}" and orjson.loads(body)["body"] == "x" * i
    writer.write(b"GET /again?q=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    status, _, body = await read_response(reader)
    assert orjson.loads(body)["raw"] == "/again?q=1"
    writer.close()


async def test_http10_and_connection_close_end_the_connection(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    for request in (b"GET /a HTTP/1.0\r\n\r\n", b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"):
        reader, writer = await served.connect()
        writer.write(request)
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
    reader, writer = await served.connect()
    writer.write(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
    for _ in range(2):
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "keep-alive"
    writer.close()


async def test_idle_keep_alive_connections_close_after_the_timeout(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(keepalive_s=1.0)
    reader, writer = await served.connect()
    for _ in range(6):  # activity keeps it open past one timeout (never idle for most of it, however loaded)
        writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        await asyncio.sleep(0.2)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


@pytest.mark.parametrize("partial", [
    b"GET /v1/x HTTP/1.1\r\nHost: t\r\n",  # the head stops
    post("/v1/x", b"0123456789")[:-5],  # the body stops
], ids=["head", "body"])
async def test_a_client_silent_mid_request_gets_a_408(serve: Callable[..., Awaitable[Served]],
                                                      partial: bytes) -> None:
    served = await serve(read_timeout_s=0.4)
    reader, writer = await served.connect()
    writer.write(partial)
    started = asyncio.get_running_loop().time()
    status, _, body = await read_response(reader)
    assert status == 408 and orjson.loads(body)["code"] == "request_timeout"
    assert 0.35 < asyncio.get_running_loop().time() - started < 5
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_slow_client_that_keeps_sending_is_served(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(read_timeout_s=1.5, keepalive_s=0.3)
    reader, writer = await served.connect()
    request = post("/v1/x", b"0123456789")
    for i in range(0, len(request), 8):  # about 1.2 s in all, never 1.5 s silent however loaded
        writer.write(request[i:i + 8])
        await asyncio.sleep(0.1)
    status, _, body = await read_response(reader)
    assert status == 200 and orjson.loads(body)["body"] == "0123456789"
    writer.close()


async def test_a_head_trickled_in_steadily_is_cut_off_at_the_head_timeout(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(read_timeout_s=5, head_timeout_s=0.6)
    status, body, took = await trickled(served, b"GET /v1/x HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    assert status == 408 and orjson.loads(body)["code"] == "request_timeout"
    assert 0.55 < took < 4, "cut at the head timeout, not at the read timeout (5 s)"


async def test_a_body_trickled_in_steadily_is_cut_off_at_the_body_timeout(
        serve: Callable[..., Awaitable[Served]]) -> None:
    """One byte every 0.1 s is never silent for the read timeout: without an overall deadline such a body held its
    connection for as long as the client liked."""
    served = await serve(read_timeout_s=5, head_timeout_s=5, body_timeout_s=0.6)
    status, body, took = await trickled(served, b"POST /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
    assert status == 408 and orjson.loads(body)["message"] == "the request body took over 0.6s"
    assert 0.55 < took < 4, "cut at the body timeout, not at the read timeout (5 s)"


async def test_a_body_within_the_body_timeout_is_served(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(read_timeout_s=5, body_timeout_s=2.0)
    reader, writer = await served.connect()
    writer.write(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n")
    for piece in (b"01234", b"56789"):
        await asyncio.sleep(0.3)
        writer.write(piece)
    status, _, body = await read_response(reader)
    assert status == 200 and orjson.loads(body)["body"] == "0123456789"
    writer.close()


async def test_a_new_connection_that_sends_nothing_is_closed_at_the_head_timeout_but_keep_alive_waits(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(head_timeout_s=0.4, keepalive_s=5)
    silent_reader, silent_writer = await served.connect()
    reader, writer = await served.connect()
    writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    assert await asyncio.wait_for(silent_reader.read(), 4) == b""  # closed, no answer to a request never sent
    await asyncio.sleep(0.6)
    writer.write(b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n")  # idle between requests: the keep-alive limit holds
    assert (await read_response(reader))[0] == 200
    silent_writer.close()
    writer.close()


async def test_past_the_connection_cap_the_connection_idle_the_longest_is_closed(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve(max_connections=3)
    connections = [await served.connect() for _ in range(3)]
    for reader, writer in connections[1:]:  # the first stays idle the longest
        writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_response(reader))[0] == 200
    reader, writer = await served.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    assert await asyncio.wait_for(connections[0][0].read(), 2) == b""
    assert len(served.server.connections) == 3
    for other_reader, other_writer in connections[1:]:  # the others are still served
        other_writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_response(other_reader))[0] == 200
    for _, other_writer in [*connections, (reader, writer)]:
        other_writer.close()


async def test_past_the_cap_with_every_connection_busy_a_new_one_gets_a_503(
        serve: Callable[..., Awaitable[Served]]) -> None:
    release = asyncio.Event()
    served = await serve(answer_when(release), max_connections=2)
    busy = [await served.connect() for _ in range(2)]
    for _, writer in busy:
        writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.1)
    reader, writer = await served.connect()
    status, _, body = await read_response(reader)
    assert status == 503 and orjson.loads(body)["code"] == "too_many_connections"
    release.set()
    for busy_reader, busy_writer in busy:
        assert (await read_response(busy_reader))[0] == 200
        busy_writer.close()
    writer.close()


async def test_absolute_form_target_keeps_path_and_query_only(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"GET http://elsewhere:9/v1/models?x=%2F HTTP/1.1\r\nHost: t\r\n\r\n")
    _, _, body = await read_response(reader)
    assert orjson.loads(body)["raw"] == "/v1/models?x=%2F" and orjson.loads(body)["path"] == "/v1/models"
    writer.close()


async def test_declared_oversize_body_is_refused_before_it_is_sent(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await read_response(reader)  # no 100 Continue: the answer comes at once
    assert status == 200 and orjson.loads(body)["too_large"] is True and headers["connection"] == "close"
    writer.close()


async def test_expect_continue_is_answered_for_a_body_within_the_limit(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    status, _, body = await read_response(reader)
    assert status == 200 and orjson.loads(body)["body"] == "hello"
    writer.close()


async def test_chunked_body_past_the_limit_reaches_the_handler_as_too_large_and_is_drained(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(4):
        writer.write(b"200\r\n" + b"y" * 512 + b"\r\n")
    writer.write(b"0\r\n\r\n")
    _status, headers, body = await read_response(reader)
    assert orjson.loads(body)["too_large"] is True and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"BLAH\x00 / HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/x HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431,
     "request_header_fields_too_large"),
])
async def test_malformed_requests_get_a_json_error_and_a_closed_connection(
        serve: Callable[..., Awaitable[Served]], raw: bytes, status: int, code: str) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(raw)
    got, headers, body = await read_response(reader)
    assert got == status and headers["content-type"] == "application/json"
    assert orjson.loads(body)["code"] == code
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


@pytest.mark.parametrize("piece", [
    lambda i: b"X-Filler-%d: %b\r\n" % (i, b"f" * 1000),  # many fields
    lambda i: b"f" * 1000,  # one field whose value never ends (llhttp holds the part it has)
], ids=["many-fields", "endless-value"])
async def test_a_head_that_never_ends_is_refused_once_past_the_limit(
        serve: Callable[..., Awaitable[Served]], piece: Callable[[int], bytes]) -> None:
    served = await serve(max_head=4096)
    reader, writer = await served.connect()
    writer.write(b"GET /v1/x HTTP/1.1\r\nHost: t\r\nX-First: ")
    for i in range(64):  # 64 KiB of head, written in pieces; the blank line never comes
        writer.write(piece(i))
        await writer.drain()
    status, _, body = await read_response(reader)
    assert status == 431 and orjson.loads(body)["code"] == "request_header_fields_too_large"
    writer.close()


async def test_header_fields_reach_the_handler_as_sent(serve: Callable[..., Awaitable[Served]]) -> None:
    seen: list[list[tuple[str, str]]] = []

    async def keep(request: Request, out: Responder) -> None:
        seen.append(list(request.headers.items()))
        out.send(200, [(name, value) for name, value in request.headers.items() if name.startswith("X-")])

    served = await serve(keep)
    reader, writer = await served.connect()
    writer.write(b"GET /h HTTP/1.1\r\nHost: t\r\nX-Twice: a\r\nX-Twice: b\r\nX-Utf8: caf\xc3\xa9\r\n"
                 b"X-Raw: \xff\xfe\r\nX-Empty:\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert seen == [[("Host", "t"), ("X-Twice", "a"), ("X-Twice", "b"), ("X-Utf8", "café"),
                     ("X-Raw", "\udcff\udcfe"), ("X-Empty", "")]]
    assert b"\r\nX-Twice: a\r\nX-Twice: b\r\nX-Utf8: caf\xc3\xa9\r\nX-Raw: \xff\xfe\r\nX-Empty: \r\n" in head
    writer.close()


async def test_an_upgrade_request_is_served_as_plain_http_then_closed(
        serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\x81\x05hello")
    status, headers, body = await read_response(reader)
    assert status == 200 and orjson.loads(body)["path"] == "/ws" and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_head_gets_the_length_without_the_body(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\nGET /g HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"Content-Length: " in head and not head.endswith(b"0\r\n\r\n")
    status, _, body = await read_response(reader)  # the next response follows the head directly
    assert status == 200 and orjson.loads(body)["path"] == "/g"
    writer.close()


async def test_a_failing_or_silent_handler_is_a_500_and_the_connection_closes(
        serve: Callable[..., Awaitable[Served]]) -> None:
    async def failing(request: Request, out: Responder) -> None:
        if request.path == "/raise":
            raise RuntimeError("bug")

    served = await serve(failing)
    for path in (b"/raise", b"/silent"):
        reader, writer = await served.connect()
        writer.write(b"GET %b HTTP/1.1\r\nHost: t\r\n\r\n" % path)
        status, _, body = await read_response(reader)
        assert status == 500 and orjson.loads(body) == {"path": path.decode(), "status": 500,
                                                        "message": "internal proxy error", "code": "internal_error"}
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_streams_are_chunked_and_a_cut_stream_is_not_terminated(
        serve: Callable[..., Awaitable[Served]]) -> None:
    async def stream(request: Request, out: Responder) -> None:
        out.start(200, [("Content-Type", "text/event-stream")])
        for i in range(3):
            await out.write(b"data: %d\n\n" % i)
        if request.path == "/cut":
            raise ConnectionResetError("upstream went away")
        out.end()

    served = await serve(stream)
    reader, writer = await served.connect()
    writer.write(b"GET /whole HTTP/1.1\r\nHost: t\r\n\r\n")
    _status, headers, body = await read_response(reader)
    assert headers["transfer-encoding"] == "chunked" and body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    writer.write(b"GET /cut HTTP/1.1\r\nHost: t\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):  # no terminating chunk: the client can tell
        await read_response(reader)
    writer.close()


async def test_a_stream_head_is_not_held_back_by_a_slow_first_chunk(
        serve: Callable[..., Awaitable[Served]]) -> None:
    go = asyncio.Event()

    async def stream(request: Request, out: Responder) -> None:
        out.start(200, [("Content-Type", "text/event-stream")])
        await go.wait()
        await out.write(b"data: 1\n\n")
        out.end()

    served = await serve(stream)
    reader, writer = await served.connect()
    writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)  # sent while the first chunk is pending
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head
    go.set()
    assert b"data: 1" in await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    writer.close()


async def test_a_client_that_does_not_read_holds_the_writer_back(serve: Callable[..., Awaitable[Served]]) -> None:
    written = [0]

    async def flood(request: Request, out: Responder) -> None:
        out.start(200, [("Content-Type", "application/octet-stream")])
        for _ in range(4096):
            await out.write(b"z" * 64 * 1024)
            written[0] += 64 * 1024
        out.end()

    served = await serve(flood)
    _reader, writer = await served.connect()
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.5)
    assert written[0] < 64 * 1024 * 1024, "writes wait for the client instead of buffering 256 MiB"
    writer.close()


async def test_a_client_hanging_up_cancels_its_handler(serve: Callable[..., Awaitable[Served]]) -> None:
    cancelled = asyncio.Event()

    async def slow(request: Request, out: Responder) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    served = await serve(slow)
    _, writer = await served.connect()
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_shutdown_finishes_requests_in_flight_and_closes_idle_connections(
        serve: Callable[..., Awaitable[Served]]) -> None:
    release = asyncio.Event()
    served = await serve(answer_when(release))
    idle_reader, idle_writer = await served.connect()
    busy_reader, busy_writer = await served.connect()
    busy_writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.1)
    shutdown = asyncio.create_task(served.server.shutdown(5.0))
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # the idle connection closed at once
    with pytest.raises(OSError):
        await served.connect()  # no longer listening
    release.set()
    status, _, _ = await read_response(busy_reader)  # the request in flight was answered
    assert status == 200
    await asyncio.wait_for(shutdown, 5)
    assert await asyncio.wait_for(busy_reader.read(), 5) == b""
    idle_writer.close()
    busy_writer.close()


async def test_shutdown_serves_a_request_still_arriving(serve: Callable[..., Awaitable[Served]]) -> None:
    served = await serve()
    reader, writer = await served.connect()
    writer.write(b"POST /late HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhello")
    await asyncio.sleep(0.1)
    shutdown = asyncio.create_task(served.server.shutdown(5.0))
    await asyncio.sleep(0.1)
    writer.write(b"world")
    status, headers, body = await read_response(reader)
    assert status == 200 and orjson.loads(body)["body"] == "helloworld" and headers["connection"] == "close"
    await asyncio.wait_for(shutdown, 5)
    writer.close()


async def test_shutdown_cancels_what_outlives_the_grace_period(serve: Callable[..., Awaitable[Served]]) -> None:
    async def stuck(request: Request, out: Responder) -> None:
        await asyncio.sleep(30)

    served = await serve(stuck)
    _reader, writer = await served.connect()
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    await served.server.shutdown(0.3)
    assert asyncio.get_running_loop().time() - started < 3
    assert not served.server.connections
    writer.close()
