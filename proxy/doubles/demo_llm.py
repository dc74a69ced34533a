"""DemoLLM: the TEST upstream of ``ragproxy demo``, an OpenAI-compatible server that answers with canned text.

Not a model: it answers every chat question with ``Demo answer #N to: <question>`` (N counts the calls it
served, so a cached answer shows which call produced it). Routes: ``POST /v1/chat/completions`` (plain, and
streamed as ``chat.completion.chunk`` events ending in ``data: [DONE]``, with a usage chunk when
``stream_options.include_usage`` is set) and ``GET /v1/models``; anything else answers an OpenAI-shaped 404.
Usage counts words as tokens.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

MODEL = "demo-model"


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _question(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    content = messages[-1].get("content")
    return content if isinstance(content, str) else None


class DemoLLM:
    """The aiohttp app (:attr:`app`) and how many chat calls it answered (:attr:`calls`)."""

    def __init__(self) -> None:
        self.calls = 0
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_route("*", "/{tail:.*}", self._not_found)

    async def _models(self, _: web.Request) -> web.Response:
        listing = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "ragproxy"}]}
        return web.Response(body=orjson.dumps(listing), content_type="application/json")

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, f"{request.method} {request.path} is not served by the demo upstream", "not_found_error")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "the body is not JSON", "invalid_request_error")
        question = _question(body) if isinstance(body, dict) else None
        if question is None:
            return _error(400, "messages must end with a message whose content is a string", "invalid_request_error")
        self.calls += 1
        answer = f"Demo answer #{self.calls} to: {question}"
        model = str(body.get("model") or MODEL)
        usage = {"prompt_tokens": sum(len(str(m.get("content", "")).split()) for m in body["messages"]
                                      if isinstance(m, dict)),
                 "completion_tokens": len(answer.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        made = {"id": f"chatcmpl-demo-{self.calls}", "created": int(time.time()), "model": model}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, made, answer, usage if include_usage else None)
        choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "logprobs": None,
                  "finish_reason": "stop"}
        completion = {"id": made["id"], "object": "chat.completion", "created": made["created"], "model": model,
                      "choices": [choice], "usage": usage}
        return web.Response(body=orjson.dumps(completion), content_type="application/json")

    @staticmethod
    async def _stream(request: web.Request, made: dict[str, Any], answer: str,
                      usage: dict[str, int] | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        chunk = {"id": made["id"], "object": "chat.completion.chunk", "created": made["created"],
                 "model": made["model"]}
        words = answer.split(" ")
        deltas = [{"role": "assistant", "content": ""}, *({"content": w if i == 0 else " " + w}
                                                          for i, w in enumerate(words))]
        events = [{**chunk, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
                  for delta in deltas]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
        if usage is not None:
            events.append({**chunk, "choices": [], "usage": usage})
        for event in events:
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
