"""The transport (:mod:`proxy.upstream.http1`, and ``UpstreamClient.fetch`` on it) against a raw TCP peer that
writes exact HTTP/1.1 bytes.

The peer is a test double of an upstream server: each test scripts what it answers, byte for byte, so framing
(Content-Length, chunked, read-until-close), keep-alive, resets and stalls are what the test says they are.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.upstream import http1
from proxy.upstream.client import UpstreamClient
from proxy.upstream.http1 import ConnectFailed, ConnectionReset, Http1Client, split_url

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawPeer:
    """A loopback TCP server running ``script`` for each connection; counts connections and keeps requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawPeer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        self.requests.append(head + body)
        return head + body


def keep_alive_answers(peer_box: list[RawPeer], body: bytes = b'{"ok":true}') -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await peer_box[0].read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
    return script


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    http = Http1Client(connect_timeout=2, read_timeout=1, limit=4)
    yield http
    await http.close()


async def scripted(script: Script) -> RawPeer:
    return await RawPeer(script).__aenter__()


async def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request(client: Http1Client) -> None:
    box: list[RawPeer] = []
    async with RawPeer(keep_alive_answers(box)) as peer:
        box.append(peer)
        for _ in range(5):
            response = await client.request("POST", peer.url + "/v1/chat/completions?x=1",
                                            {"Content-Type": "application/json", "X-Request-ID": "r1"}, b'{"a":1}')
            assert response.status == 200 and response.content_type == "application/json"
            assert await response.read(1) == b'{"ok":true}'
            response.release()
        assert peer.connections == 1
        head = peer.requests[0]
        assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nContent-Length: 7\r\n" in head and head.endswith(b'\r\n\r\n{"a":1}')
        assert b"X-Request-ID: r1\r\n" in head


async def test_chunked_body_is_decoded_and_the_connection_reused(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await peer.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            await writer.drain()

    async with RawPeer(script) as peer:
        for _ in range(2):
            response = await client.request("GET", peer.url + "/v1/models", {}, None)
            assert await response.read(1) == b"hello world"
            response.release()
        assert peer.connections == 1
        assert b"Content-Length" not in peer.requests[0]  # a GET without a body says nothing about one


async def test_one_connection_carries_responses_of_every_framing_in_turn(client: Http1Client) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-N: 1\r\n\r\n3\r\none\r\n0\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\nX-N: 2\r\n\r\ntwo",
        b"HTTP/1.1 204 No Content\r\nX-N: 3\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-N: 4\r\n\r\nfour",
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nX-N: 5\r\n\r\n",
    ]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await peer.read_request(reader)
            writer.write(answer)
            await writer.drain()

    async with RawPeer(script) as peer:
        got = []
        for _ in answers:
            response = await client.request("POST", peer.url + "/x", {}, b"{}")
            got.append((response.status, response.headers["X-N"], await response.read(1)))
            response.release()
        assert got == [(200, "1", b"one"), (201, "2", b"two"), (204, "3", b""), (200, "4", b"four"), (404, "5", b"")]
        assert peer.connections == 1


async def test_body_until_close_and_connection_close_are_never_reused(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    async with RawPeer(script) as peer:
        for _ in range(2):
            response = await client.request("POST", peer.url + "/x", {}, b"{}")
            assert await response.read(1) == b"all of it"
            response.release()
        assert peer.connections == 2


async def test_gzip_bodies_are_decoded(client: Http1Client) -> None:
    packed = gzip.compress(b'{"answer": "' + b"x" * 1000 + b'"}')

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed) + packed)
        await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        assert response.decoded and (await response.read(1)).endswith(b'x"}')
        response.release()


async def test_an_idle_connection_the_server_closed_is_not_reused(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()  # then the server closes the keep-alive connection (its idle timeout)

    async with RawPeer(script) as peer:
        for _ in range(3):
            response = await client.request("POST", peer.url + "/x", {}, b"{}")
            assert await response.read(1) == b"ok"
            response.release()
            await asyncio.sleep(0.05)
        assert peer.connections == 3


async def test_failures_map_to_refused_reset_and_timeout(client: Http1Client) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with pytest.raises(ConnectFailed):
        await client.request("POST", f"http://127.0.0.1:{closed_port}/x", {}, b"{}")

    async def reset_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with RawPeer(reset_mid_body) as peer:
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        with pytest.raises(ConnectionReset):
            await response.read(1)
        response.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        await asyncio.sleep(5)

    async with RawPeer(silent) as peer:
        with pytest.raises(TimeoutError):
            await client.request("POST", peer.url + "/x", {}, b"{}")

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with RawPeer(garbage) as peer:
        with pytest.raises(ConnectionReset):
            await client.request("POST", peer.url + "/x", {}, b"{}")


async def test_streams_arrive_piece_by_piece_and_a_stall_is_a_timeout(client: Http1Client) -> None:
    release = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"d\r\ndata: first\n\n\r\n")
        await writer.drain()
        await release.wait()
        await asyncio.sleep(5)  # then silence

    async with RawPeer(script) as peer:
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        assert response.content_type == "text/event-stream"
        chunks = response.iter_chunks(1)
        assert await chunks.__anext__() == b"data: first\n\n"  # before the server has finished
        release.set()
        with pytest.raises(TimeoutError):
            await chunks.__anext__()
        response.close()


async def test_the_silence_limit_restarts_with_every_piece(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(4):  # 2.4 s in all, never 1 s silent
            await asyncio.sleep(0.6)
            writer.write(b"6\r\npiece\n\r\n")
            await writer.drain()
        await asyncio.sleep(0.6)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async with RawPeer(script) as peer:
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        assert [chunk async for chunk in response.iter_chunks(1)] == [b"piece\n"] * 4
        assert loop.time() - started > 2.4
        response.release()
        with pytest.raises(TimeoutError):  # the same connection, no answer this time: the limit still holds
            await client.request("POST", peer.url + "/x", {}, b"{}")
        assert peer.connections == 1


async def test_a_slow_consumer_pauses_reading_instead_of_buffering(client: Http1Client) -> None:
    piece = b"x" * 65536

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                     % (len(piece) * 64))
        for _ in range(64):
            writer.write(piece)
            await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        await asyncio.sleep(0.5)  # the server pushes 4 MiB while nobody reads
        assert response._buffered < 1024 * 1024
        total = 0
        async for chunk in response.iter_chunks(2):
            total += len(chunk)
        assert total == len(piece) * 64
        response.release()


async def test_informational_responses_are_skipped_and_head_has_no_body(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await peer.read_request(reader)
            if request.startswith(b"HEAD"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                             b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
            await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("POST", peer.url + "/x", {}, b"{}")
        assert response.status == 201 and "Link" not in response.headers
        assert await response.read(1) == b"done"
        response.release()
        head = await client.request("HEAD", peer.url + "/x", {}, None)
        assert head.status == 200 and await head.read(1) == b""
        head.release()


async def test_response_header_fields_arrive_as_sent(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Utf8: caf\xc3\xa9\r\n"
                     b"X-Raw: \xff\r\nContent-Type: Text/Plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("GET", peer.url + "/h", {}, None)
        assert response.raw_headers == [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("X-Utf8", "café"),
                                         ("X-Raw", "\udcff"), ("Content-Type", "Text/Plain; charset=utf-8"),
                                         ("Content-Length", "2")]
        assert response.content_type == "text/plain" and response.headers.getall("set-cookie") == ["a=1", "b=2"]
        assert await response.read(1) == b"ok"
        response.release()


@pytest.mark.parametrize("head", [
    pytest.param(b"X-Endless: " + b"v" * 200_000, id="endless-value"),  # never finished: llhttp would hold it
    pytest.param(b"".join(b"X-Field-%d: %s\r\n" % (i, b"v" * 100) for i in range(1000)) + b"\r\n", id="many-fields"),
])
async def test_a_response_head_over_the_limit_fails_as_malformed(client: Http1Client, head: bytes) -> None:
    answered = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + head)
        await writer.drain()
        answered.set()
        await asyncio.sleep(2)

    async with RawPeer(script) as peer:
        with pytest.raises(ConnectionReset, match="the head exceeds 65536 bytes"):
            await client.request("GET", peer.url + "/h", {}, None)
        assert answered.is_set()
    async with RawPeer(keep_alive_answers(box := [])) as peer:  # a head under the limit passes
        box.append(peer)
        response = await client.request("GET", peer.url + "/h", {}, None)
        assert response.status == 200 and await response.read(1) == b'{"ok":true}'
        response.release()


async def test_url_credentials_become_basic_auth_and_unsafe_headers_are_refused(client: Http1Client) -> None:
    box: list[RawPeer] = []
    async with RawPeer(keep_alive_answers(box)) as peer:
        box.append(peer)
        url = peer.url.replace("http://", "http://ops:s%40cret@") + "/x"
        response = await client.request("POST", url, {}, b"{}")
        await response.read(1)
        response.release()
        assert b"Authorization: Basic b3BzOnNAY3JldA==\r\n" in peer.requests[0]
        assert b"ops" not in peer.requests[0].split(b"\r\n")[1]  # Host carries no credentials
        with pytest.raises(ValueError):
            await client.request("POST", peer.url + "/x", {"X-Evil": "a\r\nInjected: yes"}, b"{}")


async def test_the_pool_limit_makes_requests_wait_for_a_connection() -> None:
    http = Http1Client(connect_timeout=2, read_timeout=2, limit=2)
    box: list[RawPeer] = []
    try:
        async with RawPeer(keep_alive_answers(box)) as peer:
            box.append(peer)

            async def one() -> bytes:
                response = await http.request("POST", peer.url + "/x", {}, b"{}")
                body = await response.read(2)
                response.release()
                return body

            assert await asyncio.gather(*(one() for _ in range(20))) == [b'{"ok":true}'] * 20
            assert peer.connections <= 2
    finally:
        await http.close()


def test_split_url() -> None:
    origin, target = split_url("https://api.example.com/v1/models?limit=1")
    assert (origin.host, origin.port, origin.tls, origin.host_header, target) == (
        "api.example.com", 443, True, "api.example.com", "/v1/models?limit=1")
    origin, target = split_url("http://[::1]:9000")
    assert (origin.host, origin.port, origin.host_header, target) == ("::1", 9000, "[::1]:9000", "/")
    for bad in ("ftp://x/", "no-scheme", "http:///x", "http://h/a b"):
        with pytest.raises(ValueError):
            split_url(bad)


@pytest.mark.parametrize("size", [670_000, 10 * 2**20, 64 * 2**20], ids=["670KB", "10MB", "64MB"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_complete_body_of_any_size_is_read_whole(client: Http1Client, size: int, framing: str) -> None:
    """Reading past the flow-control mark (256 KiB) resumes the socket: no body waits for the silence limit."""
    body = bytes(range(256)) * (size // 256)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for start in range(0, len(body), 1 << 20):
                piece = body[start:start + (1 << 20)]
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await peer.read_request(reader)  # the connection is reused for the next request
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("GET", peer.url + "/big", {}, None)
        assert await response.read(1) == body
        response.release()
        again = await client.request("GET", peer.url + "/small", {}, None)
        assert await again.read(1) == b"ok"
        again.release()
        assert peer.connections == 1


@pytest.mark.parametrize("size", [670_000, 64 * 2**20], ids=["670KB", "64MB"])
async def test_a_large_request_body_is_sent_whole(size: int) -> None:
    body = bytes(range(256)) * (size // 256)
    client = Http1Client(connect_timeout=2, read_timeout=30, limit=4)  # the peer reads 64 MB before it answers

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = await peer.read_request(reader)
        digest = str(len(received.partition(b"\r\n\r\n")[2])).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(digest), digest))
        await writer.drain()

    async with RawPeer(script) as peer:
        response = await client.request("POST", peer.url + "/upload", {}, body)
        assert await response.read(2) == str(len(body)).encode()
        response.release()
        assert peer.requests[0].endswith(body[-1000:])
    await client.close()


def closes_the_second_request_unanswered(peer_box: list[RawPeer]) -> Script:
    """Answers one request per connection with keep-alive, then closes when a second request arrives on it: a
    server whose idle timeout fired just as the client reused the connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer_box[0].read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
    return script


@pytest.mark.parametrize("method", ["GET", "PUT", "POST"])
async def test_a_pooled_connection_the_server_closed_as_the_request_went_out_is_replaced_once(
        client: Http1Client, method: str) -> None:
    """The keep-alive race: the server closed the idle connection, unread, as the request went out. It never
    processed the request, so any method is sent again, on a new connection."""
    box: list[RawPeer] = []
    async with RawPeer(closes_the_second_request_unanswered(box)) as peer:
        box.append(peer)
        first = await client.request(method, peer.url + "/x", {}, b"{}")
        assert await first.read(1) == b"ok"
        first.release()
        again = await client.request(method, peer.url + "/x", {}, b"{}")
        assert await again.read(1) == b"ok"
        again.release()
        assert peer.connections == 2


def closes_the_second_request_after(peer_box: list[RawPeer], delay_s: float) -> Script:
    """Answers one request, then reads the next and drops it after ``delay_s``: a server failing while (maybe)
    working on the request, not an idle close."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer_box[0].read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await peer_box[0].read_request(reader)
        await asyncio.sleep(delay_s)
    return script


@pytest.mark.parametrize(("method", "idempotent", "resent"), [
    ("GET", None, True), ("POST", True, True), ("POST", None, False)])
async def test_a_late_loss_is_resent_only_when_idempotent(
        client: Http1Client, monkeypatch: pytest.MonkeyPatch, method: str, idempotent: bool | None,
        resent: bool) -> None:
    monkeypatch.setattr(http1, "CROSSED_CLOSE_S", 0.05)
    box: list[RawPeer] = []
    async with RawPeer(closes_the_second_request_after(box, 0.3)) as peer:
        box.append(peer)
        first = await client.request(method, peer.url + "/x", {}, b"{}")
        assert await first.read(1) == b"ok"
        first.release()
        if resent:
            again = await client.request(method, peer.url + "/x", {}, b"{}", idempotent=idempotent)
            assert await again.read(1) == b"ok"
            again.release()
            assert peer.connections == 2
        else:
            with pytest.raises(ConnectionReset):  # it reached the server, which may have worked on it
                await client.request(method, peer.url + "/x", {}, b"{}", idempotent=idempotent)
            assert peer.connections == 1 and len(peer.requests) == 2


async def test_a_loss_after_a_response_byte_or_a_timeout_is_not_resent(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 20")  # a partial head, then the close
        await writer.drain()

    async with RawPeer(script) as peer:
        first = await client.request("POST", peer.url + "/x", {}, b"{}")
        assert await first.read(1) == b"ok"
        first.release()
        with pytest.raises(ConnectionReset):
            await client.request("POST", peer.url + "/x", {}, b"{}")
        assert peer.connections == 1

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await silent_peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await silent_peer.read_request(reader)
        await asyncio.sleep(3)  # past the client's 1 s read timeout

    async with RawPeer(silent) as silent_peer:
        first = await client.request("GET", silent_peer.url + "/x", {}, None)
        assert await first.read(1) == b"ok"
        first.release()
        with pytest.raises(TimeoutError):
            await client.request("GET", silent_peer.url + "/x", {}, None)
        assert silent_peer.connections == 1


async def test_idle_time_counts_from_the_last_byte_not_from_the_release() -> None:
    """A stream read to the end but released late (relayed to a slow client): the server's idle timer started at
    its last byte, so the pool's expiry counts from there and never hands out a connection the server dropped."""
    crossed: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"7\r\ndata: 1\r\n0\r\n\r\n")
            await writer.drain()
            finished = asyncio.get_running_loop().time()
            head = await reader.readuntil(b"\r\n\r\n")
            if asyncio.get_running_loop().time() - finished >= 0.3:  # its idle limit: the close crosses the request
                crossed.append(head)
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")

    client = Http1Client(connect_timeout=2, read_timeout=1, idle_s=0.3)
    try:
        async with RawPeer(script) as peer:
            stream = await client.request("POST", peer.url + "/s", {}, b"{}")
            assert [chunk async for chunk in stream.iter_chunks(1)] == [b"data: 1"]
            await asyncio.sleep(0.25)  # the consumer is slow to let go
            stream.release()
            await asyncio.sleep(0.1)  # 0.1 s after the release, 0.35 s after the last byte
            again = await client.request("POST", peer.url + "/s", {}, b"{}")
            assert [chunk async for chunk in again.iter_chunks(1)] == [b"data: 1"]
            again.release()
            assert crossed == [] and peer.connections == 2
    finally:
        await client.close()


async def test_a_fresh_connection_that_fails_is_not_retried(client: Http1Client) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # closes every request unanswered

    async with RawPeer(script) as peer:
        with pytest.raises(ConnectionReset):
            await client.request("GET", peer.url + "/x", {}, None)
        assert peer.connections == 1


async def test_fetch_bounds_the_whole_exchange_and_frees_the_connection() -> None:
    """``UpstreamClient.fetch``'s ``timeout_s`` bounds the whole call, even when the server is never silent long
    enough for the read timeout; the connection it gave up on is not reused."""
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)

    client = UpstreamClient(connect_timeout=1, read_timeout=1, pool_size=2)
    try:
        async with RawPeer(trickle) as peer:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await client.fetch("GET", peer.url + "/slow", timeout_s=0.5)
            assert 0.45 < loop.time() - started < 5, "bounded by timeout_s, not by the 10 s trickle"
            assert not any(pool.idle for pool, _ in client.transport._pools.values())
    finally:
        await client.close()
