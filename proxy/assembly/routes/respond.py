"""Writing a :class:`Reply` to the client: complete bodies in one go, streams chunk by chunk with no buffering.

After the last byte (or a failure) the reply's finish callbacks run: with ``ok=True`` only when the client received a
complete, normally ended response — an aborted stream is never stored or settled as complete.

When the upstream breaks off a stream, an OpenAI route sends an SSE error event (which the SDKs raise) and ends
the response; any other route closes the connection mid-body, so the client sees the response is incomplete.
"""

from __future__ import annotations

import contextlib
import logging

import orjson

from proxy.core.context import Reply, RequestContext
from proxy.core.errors import Dialect
from proxy.core.outcome import add_headers
from proxy.core.reply import finish
from proxy.core.sse import DONE
from proxy.server.responder import Responder
from proxy.upstream.client import UpstreamStreamError

log = logging.getLogger("ragproxy.respond")


def _error_event(message: str) -> bytes:
    """An SSE event that the OpenAI SDKs raise as an API error, so a broken stream never looks complete."""
    payload = {"error": {"message": message, "type": "upstream_error", "param": None, "code": "upstream_reset"}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def respond(out: Responder, ctx: RequestContext, reply: Reply, dialect: Dialect) -> None:
    """Send ``reply`` with the context's extra headers."""
    headers = reply.headers
    add_headers(headers, ctx.outcome)
    headers.update(ctx.response_headers)
    headers["X-Request-ID"] = ctx.request_id
    if reply.chunks is None:
        body = reply.body or b""
        out.send(reply.status, headers.items(), body)
        if reply.wants_body:
            await finish(reply, 200 <= reply.status < 300, body)
        else:  # nothing to store or settle: the end callbacks alone, no coroutine
            reply.end(200 <= reply.status < 300)
        return

    collected: list[bytes] | None = [] if reply.wants_body else None
    ok = terminate = delivered = False
    tail = b""  # the stream's last bytes: has the client got the OpenAI stream's final event?
    try:
        out.start(reply.status, headers.items())
        async for chunk in reply.chunks:
            await out.write(chunk)
            if collected is not None:
                collected.append(chunk)
            if dialect is Dialect.OPENAI:
                tail = (tail + chunk)[-len(DONE):]
                delivered = tail == DONE
        ok = True
    except UpstreamStreamError as exc:
        log.warning("stream from upstream broke off: %s", exc)
        if dialect is Dialect.OPENAI:  # the SDKs raise the error event; elsewhere a cut-off body says it
            with contextlib.suppress(ConnectionError):
                await out.write(_error_event(str(exc)))
                terminate = True
    except ConnectionError:
        log.info("client went away mid-stream (request %s)", ctx.request_id)
    finally:
        aclose = getattr(reply.chunks, "aclose", None)
        if aclose is not None:
            await aclose()
        # The SDKs close the connection once they read [DONE], often before the upstream's response has ended
        # (the handler is then being cancelled): what the client received in full is stored and billed in full.
        await finish(reply, (ok or delivered) and 200 <= reply.status < 300, b"".join(collected or ()))
    # The terminating chunk only after storing and settling: a client that has seen the end of a stream finds it
    # billed and cached (a complete body, sent in one write, is finished after it is sent).
    if ok or terminate:
        out.end()
