"""The one HTTP client the proxy uses to reach upstreams (LLM replicas, Qdrant).

Forwarding goes through :class:`~proxy.upstream.http1.Http1Client`: pooled keep-alive connections and bounded waits
(a connect timeout, and a read timeout that bounds every silence: time to headers and each gap between streamed
chunks). Failures become
:class:`UpstreamError` with the status the client should see: 502 unreachable/reset, 504 timeout. ``retryable`` is
true only when nothing reached the upstream (connection refused), the one case where resending a POST is safe.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp

from proxy.context import Reply
from proxy.errors import ProxyError
from proxy.headers import client_response_headers
from proxy.upstream.http1 import ConnectFailed, ConnectionReset, Headers, Http1Client, Response


class UpstreamError(ProxyError):
    """An upstream that could not be reached, reset the connection or timed out."""

    def __init__(self, status: int, message: str, *, code: str, retryable: bool = False) -> None:
        super().__init__(status, message, code=code)
        self.retryable = retryable


class UpstreamClient:
    """Pooled HTTP clients for every upstream: the lean one of :mod:`proxy.upstream.http1` forwards requests,
    an aiohttp session serves everything off the hot path (health probes, metadata lookups)."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, pool_size: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.pool_size = pool_size
        self.http = Http1Client(connect_timeout=connect_timeout, read_timeout=read_timeout, limit=pool_size,
                                ssl_context=ssl_context)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.pool_size, keepalive_timeout=30)
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout, sock_read=self.read_timeout
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",), auto_decompress=True
            )
        return self._session

    async def close(self) -> None:
        await self.http.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self, method: str, url: str, headers: Headers, body: bytes | None, *, label: str = "upstream"
    ) -> Reply:
        """Send one request; a text/event-stream answer comes back streamed, anything else complete."""
        try:
            response = await self.http.request(method, url, headers, body)
        except ConnectFailed as exc:
            raise UpstreamError(502, f"{label} is unreachable: {exc}", code="upstream_unreachable",
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
