"""A trivial OpenAI-shaped upstream for overhead benchmarks: fixed answers, optional streaming, no work.

``python -m loadtest.trivial_upstream --port P``. It exists so that a benchmark measures the proxy, not a model.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web

ANSWER = (b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"A proxy forwards requests."},'
          b'"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,'
          b'"total_tokens":17}}')
CHUNK = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
         b'"choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}\n\n')


def build_app(chunks: int = 8, chunk_delay_s: float = 0.01) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' not in body.replace(b" ", b""):
            return web.Response(body=ANSWER, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(chunks):
            await response.write(CHUNK)
            await asyncio.sleep(chunk_delay_s)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(build_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
