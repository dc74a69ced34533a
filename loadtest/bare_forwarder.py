"""The floor of a Python proxy on ragproxy's stack, for the overhead benchmark: forward bytes, nothing else.

``python -m loadtest.bare_forwarder --port P --upstream URL``: aiohttp's low-level server (no router, no
middleware) and the proxy's own forwarding client (:mod:`proxy.upstream.http1`); each request is sent upstream as
it came (method, path, body, content type) and the answer returned as it came. No pipeline, no headers hygiene,
no metrics, no streaming: it shows what an HTTP server plus an HTTP client cost per request on this machine, so
the benchmark can tell the stack's share of the overhead from ragproxy's own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc

from aiohttp import web

from proxy.upstream.http1 import Http1Client


async def serve(port: int, upstream: str) -> None:
    client = Http1Client(connect_timeout=5, read_timeout=60, limit=256)

    async def forward(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        response = await client.request(request.method, upstream + request.path_qs,
                                        {"Content-Type": request.content_type}, body)
        data = await response.read(60)
        response.release()
        return web.Response(status=response.status, body=data, content_type=response.content_type or None)

    server = web.Server(forward, access_log=None)
    await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
    gc.freeze()  # as ``ragproxy serve`` does (proxy/serve.py)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
