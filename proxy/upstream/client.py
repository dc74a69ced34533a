"""The one HTTP client of the proxy: every outbound call goes through :class:`UpstreamClient`.

Its transport is :class:`~proxy.upstream.http1.Http1Client` (one pool of keep-alive connections per origin, shared by
every caller); :meth:`Http1Client.request` is the single boundary every call crosses. Two ways in:

* :meth:`UpstreamClient.send` forwards a client's request (LLM replicas, Qdrant): a text/event-stream answer comes
  back streamed, anything else complete. Failures become :class:`UpstreamError` with the status the client should
  see: 502 unreachable/reset, 504 timeout, 503 when this process is out of descriptors (not the upstream's fault:
  ``upstream_fault`` is false, and the replica is not blamed). ``retryable`` is true only when nothing reached the
  upstream (connection refused), the one case where resending a POST elsewhere is safe. A pooled connection the
  upstream's idle timer closed as the request went out is replaced below this, in the transport (no 502 for it).
* :meth:`UpstreamClient.fetch` is every other call, read whole within an overall ``timeout_s``: health probes,
  llama.cpp ``/slots`` discovery, the upstream embedder, the retrieval cache's collection lookup, ``/readyz``'s
  Qdrant check and the semantic index's Qdrant store. Failures raise :class:`OSError` (``ConnectFailed``,
  ``ConnectionReset``, ``TimeoutError``, ``LocalResourceError``) or ``ValueError`` for a URL that cannot be sent.

A connect timeout bounds every connect; the read timeout bounds every silence (time to headers, each gap between
body chunks).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from multidict import CIMultiDict

from proxy.core.errors import ProxyError
from proxy.core.headers import client_response_headers
from proxy.core.reply import Reply
from proxy.upstream.http1 import ConnectFailed, ConnectionReset, Headers, Http1Client, LocalResourceError, Response


class UpstreamError(ProxyError):
    """An upstream that could not be reached, reset the connection or timed out."""

    def __init__(self, status: int, message: str, *, code: str, retryable: bool = False,
                 upstream_fault: bool = True, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, code=code, headers=headers)
        self.retryable = retryable
        self.upstream_fault = upstream_fault


@dataclass(frozen=True, slots=True)
class Fetched:
    """A complete answer of :meth:`UpstreamClient.fetch`."""

    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (``orjson.JSONDecodeError``, a ``ValueError``, when it is not)."""
        return orjson.loads(self.body)


class UpstreamClient:
    """Pooled HTTP/1.1 requests to every upstream, through one transport."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, pool_size: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.read_timeout = read_timeout
        self.transport = Http1Client(connect_timeout=connect_timeout, read_timeout=read_timeout, limit=pool_size,
                                     ssl_context=ssl_context)

    async def close(self) -> None:
        await self.transport.close()

    async def fetch(self, method: str, url: str, *, headers: Headers = (), body: bytes | None = None,
                    timeout_s: float | None = None, idempotent: bool | None = None) -> Fetched:
        """One complete exchange, bounded by ``timeout_s`` in all (``None``: the connect and read timeouts only).

        ``idempotent`` (default: by method) allows one resend on a pooled connection the server had closed, even when
        the close did not come at once (:meth:`Http1Client.request`)."""
        async with asyncio.timeout(timeout_s):
            response = await self.transport.request(method, url, headers, body, idempotent=idempotent)
            try:
                data = await response.read(self.read_timeout)
            except BaseException:
                response.close()
                raise
        response.release()
        return Fetched(response.status, response.headers, data)

    async def send(
        self, method: str, url: str, headers: Headers, body: bytes | None, *, label: str = "upstream"
    ) -> Reply:
        """Forward one request; a text/event-stream answer comes back streamed, anything else complete."""
        try:
            response = await self.transport.request(method, url, headers, body)
        except LocalResourceError as exc:
            raise UpstreamError(503, f"the proxy is out of resources ({exc.strerror}); retry shortly",
                                code="proxy_overloaded", upstream_fault=False, headers={"Retry-After": "1"}) from None
        except ConnectFailed as exc:
            raise UpstreamError(502, f"{label} is unreachable: {exc.strerror}", code="upstream_unreachable",
                                retryable=True) from None
        except ConnectionReset as exc:
            raise UpstreamError(502, f"{label} closed the connection ({exc})", code="upstream_reset") from None
        except TimeoutError:
            raise UpstreamError(504, f"{label} did not answer within {self.read_timeout:g}s",
                                code="upstream_timeout") from None
        except ValueError as exc:
            raise ProxyError(400, f"the request cannot be forwarded: {exc}", code="invalid_request") from None
        headers_out = client_response_headers(response.raw_headers)  # Content-Encoding is not among them
        if response.content_encoding and not response.decoded:
            headers_out["Content-Encoding"] = response.content_encoding
        if response.content_type == "text/event-stream":
            return Reply(status=response.status, headers=headers_out,
                         chunks=_relay(response, label, self.read_timeout))
        try:
            body = await response.read(self.read_timeout)
        except ConnectionReset as exc:
            response.close()
            raise UpstreamError(502, f"{label} reset the connection mid-body ({exc})",
                                code="upstream_reset") from None
        except TimeoutError:
            response.close()
            raise UpstreamError(504, f"{label} stalled mid-body for {self.read_timeout:g}s",
                                code="upstream_timeout") from None
        except BaseException:
            response.close()
            raise
        response.release()
        return Reply(status=response.status, headers=headers_out, body=body)


class UpstreamStreamError(Exception):
    """A streamed upstream response broke off after it had started."""


async def _relay(response: Response, label: str, read_timeout: float) -> AsyncIterator[bytes]:
    """Yield chunks as they arrive; closing early (client gone) drops the upstream connection."""
    finished = False
    try:
        async for chunk in response.iter_chunks(read_timeout):
            yield chunk
        finished = True
    except ConnectionReset as exc:
        raise UpstreamStreamError(f"{label} reset the stream ({exc})") from None
    except TimeoutError:
        raise UpstreamStreamError(f"{label} stalled mid-stream") from None
    finally:
        if finished:
            response.release()
        else:
            response.close()
