"""The floor of a Python proxy on ragproxy's stack, for the overhead benchmark: forward bytes, nothing else.

``python -m loadtest.bare_forwarder --port P --upstream URL``: the proxy's own server (:mod:`proxy.server`) and
forwarding client (:mod:`proxy.upstream.http1`); each request is sent upstream as it came (method, path, body,
content type) and the answer returned as it came. No pipeline, no headers hygiene,
no metrics, no streaming: it shows what an HTTP server plus an HTTP client cost per request on this machine, so
the benchmark can tell the stack's share of the overhead from ragproxy's own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc

from proxy.server.connection import HttpServer
from proxy.server.request import Request
from proxy.server.responder import Responder
from proxy.upstream.http1 import Http1Client


async def serve(port: int, upstream: str) -> None:
    client = Http1Client(connect_timeout=5, read_timeout=60, limit=256)

    async def forward(request: Request, out: Responder) -> None:
        response = await client.request(request.method, upstream + request.raw_path,
                                        {"Content-Type": request.content_type}, request.body)
        data = await response.read(60)
        response.release()
        out.send(response.status, [("Content-Type", response.content_type or "application/octet-stream")], data)

    server = HttpServer(forward, max_body=1 << 24, error_body=lambda *_: b"{}")
    await server.start("127.0.0.1", port)
    gc.freeze()  # as ``ragproxy serve`` does (commands/serve.py)
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
