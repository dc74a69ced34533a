"""FakeLLM: a test double of an OpenAI-compatible inference server (aiohttp), optionally modelling a KV cache.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (both streaming and not), ``POST /v1/responses``
(streaming and not, function calls, reasoning summaries; responses are stored unless ``store`` is false, continue
with ``previous_response_id``, and are read back with ``GET /v1/responses/{id}``, deleted with ``DELETE
/v1/responses/{id}``, their input listed by ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/{id}/cancel`` answered; input counted by ``POST /v1/responses/input_tokens`` and compacted by ``POST
/v1/responses/compact``; ``item_reference`` input items read from the stored items; ``background`` answered with
the queued object, the finished one kept for a later ``GET``: see :mod:`upstream_doubles.openai_responses`), ``POST
/v1/embeddings`` (float or base64), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /slots``
(llama.cpp-style, with a KV model); other ``/v1/*`` answer an OpenAI-shaped 404. One choice per request (``n`` is
ignored); no tool calls in chat. Bodies follow :mod:`upstream_doubles.openai_shapes`.

Per request: faults armed in ``faults`` (:mod:`upstream_doubles.llm_faults`), then ``latency_s`` before the
response headers, then (when ``kv`` is set) a slot from ``slots`` parallel slots and the prefill time the
:class:`~upstream_doubles.kv_cache.KVCacheModel` reports, then ``chunk_latency_s`` per generated piece. With ``kv``
set the usage reports ``prompt_tokens_details.cached_tokens`` and the body (the final chunk when streaming)
carries llama.cpp-style ``timings`` (``cache_n``, ``prompt_n``, ``prompt_ms``, ``predicted_n``,
``predicted_ms``, ``queue_ms``). ``cache_prompt``/``id_slot`` hints are honoured as documented in
:mod:`upstream_doubles.kv_cache`.

``flavor`` shapes answers like one real server: ``"openai"`` (default), ``"llamacpp"`` (first stream delta
``content: null``, ``timings`` on every answer and on the finishing chunk, ``Content-Type: application/json;
charset=utf-8``), ``"vllm"`` (``prompt_logprobs``/``kv_transfer_params`` on chat answers, ``stop_reason`` on
choices, embeddings answers with ``id``, ``created`` and vLLM's longer ``usage``).

Everything is an attribute a test may change while the server runs: ``latency_s``, ``chunk_latency_s``,
``answer`` (a ``prompt -> text`` callable), ``kv``, ``faults``, ``flavor``; ``log`` records every request.

Process: ``python -m upstream_doubles.llm_server --port 8001 --kv-blocks 4096 --slots 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.loopback import LOOPBACK
from upstream_doubles import openai_responses as responses
from upstream_doubles import openai_shapes as shapes
from upstream_doubles.kv_cache import LLAMA_SERVER_SLOTS, KVCacheModel, tokenize
from upstream_doubles.llm_faults import Fault, FaultPlan
from upstream_doubles.served_app import ServedApp

AnswerFn = Callable[[str], str]


@dataclass(frozen=True)
class PrefillReport:
    """What the prefill step of one request cost."""

    prompt_tokens: int
    cached: int
    uncached: int
    prefill_s: float
    queue_s: float

    def timings(self, predicted_n: int, predicted_s: float) -> dict[str, Any]:
        return {
            "cache_n": self.cached,
            "prompt_n": self.uncached,
            "prompt_ms": round(self.prefill_s * 1000, 3),
            "predicted_n": predicted_n,
            "predicted_ms": round(predicted_s * 1000, 3),
            "queue_ms": round(self.queue_s * 1000, 3),
        }


class SlotPool:
    """``size`` parallel slots; a request waits for any free slot, or for the one it names."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._busy = [False] * size
        self._changed = asyncio.Condition()
        self.waiting = 0

    @property
    def busy(self) -> list[bool]:
        return list(self._busy)

    def _pick(self, wanted: int | None) -> int | None:
        if wanted is not None:
            return None if self._busy[wanted] else wanted
        return next((i for i, busy in enumerate(self._busy) if not busy), None)

    @asynccontextmanager
    async def slot(self, wanted: int | None = None) -> AsyncIterator[int]:
        if wanted is not None and not 0 <= wanted < self.size:
            wanted = None
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self._pick(wanted) is not None)
            finally:
                self.waiting -= 1
            index = self._pick(wanted)
            assert index is not None
            self._busy[index] = True
        try:
            yield index
        finally:
            async with self._changed:
                self._busy[index] = False
                self._changed.notify_all()


def _bad_request(message: str, param: str | None = None) -> web.Response:
    return web.json_response(shapes.error_body(message, "invalid_request_error", None, param), status=400)


def _reset_connection(request: web.Request) -> None:
    """Close the client's TCP connection with RST (no FIN, no remaining body)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FakeLLM(ServedApp):
    """OpenAI-wire test double. ``url`` is the server root; ``base_url`` (``url + "/v1"``) is for the SDK."""

    def __init__(
        self,
        *,
        model: str = "fake-model",
        models: Sequence[str] = (),
        answer: AnswerFn = shapes.default_answer,
        embedding_dim: int = 16,
        latency_s: float = 0.0,
        chunk_latency_s: float = 0.0,
        end_latency_s: float = 0.0,
        kv: KVCacheModel | None = None,
        slots: int = LLAMA_SERVER_SLOTS,
        flavor: str = "openai",
        host: str = LOOPBACK,
        port: int = 0,
        sock: socket.socket | None = None,
    ) -> None:
        super().__init__(host=host, port=port, sock=sock)
        self.model = model
        self.models = [model, *[m for m in models if m != model]]
        self.answer = answer
        self.embedding_dim = embedding_dim
        self.latency_s = latency_s
        self.chunk_latency_s = chunk_latency_s
        self.end_latency_s = end_latency_s  # pause between a stream's [DONE] event and the end of the response
        self.kv = kv
        self.slots = slots
        self.flavor = flavor
        self.faults = FaultPlan()
        self.stored: dict[str, responses.StoredResponse] = {}
        self.in_flight = 0  # generation requests being answered now
        self.disconnects = 0  # generation requests whose client went away before the end
        self._pool: SlotPool | None = None

    @property
    def base_url(self) -> str:
        """What to give ``openai.OpenAI(base_url=...)``."""
        return f"{self.url}/v1"

    async def start(self) -> None:
        self._pool = SlotPool(self.slots)
        await super().start()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/responses/input_tokens", self._input_tokens)
        app.router.add_post("/v1/responses/compact", self._compact)
        app.router.add_get("/v1/responses/{response_id}", self._stored_response)
        app.router.add_delete("/v1/responses/{response_id}", self._delete_response)
        app.router.add_get("/v1/responses/{response_id}/input_items", self._input_items)
        app.router.add_post("/v1/responses/{response_id}/cancel", self._cancel_response)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/slots", self._slots)
        app.router.add_route("*", "/v1/{tail:.*}", self._unknown)

    # -- routes ----------------------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _slots(self, request: web.Request) -> web.Response:
        """llama.cpp-style ``GET /slots``: one entry per slot, with the context each could hold."""
        if self.kv is None or self._pool is None:
            body = shapes.error_body("This server does not support slots endpoint.", "not_supported_error")
            return web.json_response(body, status=501)
        n_ctx = self.kv.capacity_blocks * self.kv.block_size // self.slots
        return web.json_response(
            [{"id": i, "n_ctx": n_ctx, "is_processing": busy} for i, busy in enumerate(self._pool.busy)]
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(shapes.model_list(self.models))

    async def _model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        if model_id not in self.models:
            body = shapes.error_body(
                f"The model '{model_id}' does not exist", "invalid_request_error", "model_not_found", "model"
            )
            return web.json_response(body, status=404)
        return web.json_response(shapes.model_card(model_id))

    async def _unknown(self, request: web.Request) -> web.Response:
        body = shapes.error_body(
            f"Unknown request URL: {request.method} {request.path}", "invalid_request_error", "unknown_url"
        )
        return web.json_response(body, status=404)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad_request("'messages' must be a non-empty array", "messages")
        return await self._generate(request, body, shapes.prompt_of_messages(messages), chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        if not isinstance(prompt, str):
            return _bad_request("'prompt' must be a string or an array of strings", "prompt")
        return await self._generate(request, body, prompt, chat=False)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        items = body.get("input")
        if not (isinstance(items, str) or (isinstance(items, list) and items)):
            return _bad_request("'input' must be a string or a non-empty array", "input")
        earlier = self._earlier(body)
        if isinstance(earlier, web.Response):
            return earlier
        fault = self.faults.take()
        early = await self._before_answer(request, fault)
        if early is not None:
            return early
        reset_after = fault.after_chunks if fault is not None and fault.kind == "reset" else None
        prompt = responses.prompt_of(body, earlier, self._stored_item)
        output, incomplete, output_tokens = responses.output_items(body, self.answer, prompt)
        result = responses.response_object(body, str(body.get("model") or self.model), output, incomplete,
                                           shapes.count_tokens(prompt), output_tokens)
        if body.get("store", True) or body.get("background"):
            said = " ".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
            turns = [{"role": "user", "text": line} for line in prompt.splitlines()]
            self.stored[result["id"]] = responses.StoredResponse(
                result, [*turns, {"role": "assistant", "text": said}], responses.input_items(body))
        if body.get("background"):  # queued: the work is done, and its usage read, by a later GET
            return web.json_response(responses.queued(result), dumps=_dumps)
        if not body.get("stream"):
            return web.json_response(result, dumps=_dumps)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        obfuscate = (body.get("stream_options") or {}).get("include_obfuscation", True) is not False
        for index, event in enumerate(responses.stream_events(result, obfuscate=obfuscate)):
            if reset_after is not None and index >= reset_after:
                _reset_connection(request)
                return response
            if self.chunk_latency_s > 0:
                await asyncio.sleep(self.chunk_latency_s)
            await response.write(responses.encode(event))
        await response.write_eof()
        return response

    def _earlier(self, body: dict[str, Any]) -> list[dict[str, str]] | web.Response:
        """The turns a body's ``previous_response_id`` continues (a 400 when it names none)."""
        previous = body.get("previous_response_id")
        if previous is None:
            return []
        if previous not in self.stored:
            return web.json_response(responses.unknown_previous(str(previous)), status=400)
        return self.stored[previous].turns

    def _stored_item(self, item_id: str) -> dict[str, Any] | None:
        """A stored item by id: an input or output item of a stored response."""
        for stored in self.stored.values():
            for item in (*stored.items, *stored.response["output"]):
                if item.get("id") == item_id:
                    found: dict[str, Any] = item
                    return found
        return None

    async def _input_tokens(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        earlier = self._earlier(body)
        if isinstance(earlier, web.Response):
            return earlier
        prompt = responses.prompt_of(body, earlier, self._stored_item)
        return web.json_response({"object": "response.input_tokens", "input_tokens": shapes.count_tokens(prompt)})

    async def _compact(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        earlier = self._earlier(body)
        if isinstance(earlier, web.Response):
            return earlier
        prompt = responses.prompt_of(body, earlier, self._stored_item)
        return web.json_response(responses.compacted(prompt), dumps=_dumps)

    async def _stored_response(self, request: web.Request) -> web.Response:
        stored = self.stored.get(request.match_info["response_id"])
        if stored is None:
            return web.json_response(responses.unknown_response(request.match_info["response_id"]), status=404)
        return web.json_response(stored.response, dumps=_dumps)

    async def _delete_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if self.stored.pop(response_id, None) is None:
            return web.json_response(responses.unknown_response(response_id), status=404)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})

    async def _input_items(self, request: web.Request) -> web.Response:
        stored = self.stored.get(request.match_info["response_id"])
        if stored is None:
            return web.json_response(responses.unknown_response(request.match_info["response_id"]), status=404)
        page = responses.item_page(stored.items, request.query)
        if page is None:
            return _bad_request("Invalid 'order' or 'limit'.")
        return web.json_response(page, dumps=_dumps)

    async def _cancel_response(self, request: web.Request) -> web.Response:
        stored = self.stored.get(request.match_info["response_id"])
        if stored is None:
            return web.json_response(responses.unknown_response(request.match_info["response_id"]), status=404)
        return _bad_request("Only responses created with background set to true can be cancelled.")

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        fault = self.faults.take()
        early = await self._before_answer(request, fault)
        if early is not None:
            return early
        if fault is not None and fault.kind == "reset":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            _reset_connection(request)
            return response
        try:
            inputs = shapes.embedding_inputs(body.get("input"))
        except ValueError as error:
            return _bad_request(str(error), "input")
        dimensions = body.get("dimensions") or self.embedding_dim
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64") or not isinstance(dimensions, int) or dimensions < 1:
            return _bad_request("invalid 'encoding_format' or 'dimensions'")
        model = str(body.get("model") or self.model)
        result = shapes.embeddings(model, inputs, dimensions, encoding)
        if self.flavor == "vllm":
            result = {"id": shapes.new_id("embd"), "created": int(time.time()), **result,
                      "usage": {**result["usage"], "completion_tokens": 0, "prompt_tokens_details": None}}
        return self._json(result)

    def _json(self, result: Any) -> web.Response:
        charset = "; charset=utf-8" if self.flavor == "llamacpp" else ""
        return web.Response(body=orjson.dumps(result), headers={"Content-Type": "application/json" + charset})

    # -- the generation path ---------------------------------------------------------------------------------
    async def _json_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _bad_request("We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _bad_request("The request body must be a JSON object.")
        return body

    async def _before_answer(
        self, request: web.Request, fault: Fault | None = None
    ) -> web.StreamResponse | None:
        """Apply an armed error/hang fault and the header latency; ``None`` means go on."""
        if fault is not None and fault.kind == "hang":
            await self.wait_stopping()
            return web.json_response(shapes.error_body("server stopping", "service_unavailable"), status=503)
        if fault is not None and fault.kind == "error":
            error_type = fault.error_type or shapes.ERROR_TYPES.get(fault.status, "api_error")
            body = shapes.error_body(fault.message, error_type, fault.code)
            return web.json_response(body, status=fault.status, headers=fault.headers)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        return None

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt: str, *, chat: bool
    ) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await self._answer(request, body, prompt, chat=chat)
        except asyncio.CancelledError:  # the client went away (handler cancellation is on)
            self.disconnects += 1
            raise
        finally:
            self.in_flight -= 1

    async def _answer(
        self, request: web.Request, body: dict[str, Any], prompt: str, *, chat: bool
    ) -> web.StreamResponse:
        fault = self.faults.take()
        early = await self._before_answer(request, fault)
        if early is not None:
            return early
        reset_after = fault.after_chunks if fault is not None and fault.kind == "reset" else None
        model = str(body.get("model") or self.model)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        pieces, finish = shapes.split_answer(self.answer(prompt), limit if isinstance(limit, int) else None)
        slot_hint = body.get("id_slot")
        queued = time.monotonic()
        async with self._slot(slot_hint if isinstance(slot_hint, int) and slot_hint >= 0 else None):
            use_cache = body.get("cache_prompt", True) is not False
            report = await self._prefill(prompt, use_cache, time.monotonic() - queued)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(
                    request, model, pieces, finish, report, chat, include_usage, reset_after
                )
            if self.chunk_latency_s > 0:
                await asyncio.sleep(self.chunk_latency_s * len(pieces))
            if reset_after is not None:
                response = web.StreamResponse(headers={"Content-Type": "application/json"})
                await response.prepare(request)
                _reset_connection(request)
                return response
            text = "".join(pieces)
            use = shapes.usage(report.prompt_tokens, len(pieces), report.cached)
            make = shapes.chat_completion if chat else shapes.text_completion
            result = make(shapes.new_id("chatcmpl" if chat else "cmpl"), model, text, finish, use)
            if self.kv is not None or self.flavor == "llamacpp":
                result["timings"] = report.timings(len(pieces), self.chunk_latency_s * len(pieces))
            if self.flavor == "vllm":
                result["choices"][0]["stop_reason"] = None
                result.update({"prompt_logprobs": None, "kv_transfer_params": None})
            return self._json(result)

    @asynccontextmanager
    async def _slot(self, wanted: int | None) -> AsyncIterator[None]:
        if self.kv is None or self._pool is None:
            yield
            return
        async with self._pool.slot(wanted):
            yield

    async def _prefill(self, prompt: str, use_cache: bool, queue_s: float) -> PrefillReport:
        if self.kv is None:
            return PrefillReport(shapes.count_tokens(prompt), 0, shapes.count_tokens(prompt), 0.0, 0.0)
        tokens = tokenize(prompt)
        result = self.kv.prefill(tokens, use_cache=use_cache)
        if result.seconds > 0:
            await asyncio.sleep(result.seconds)
        return PrefillReport(len(tokens), result.cached, result.uncached, result.seconds, queue_s)

    async def _stream(
        self,
        request: web.Request,
        model: str,
        pieces: list[str],
        finish: str,
        report: PrefillReport,
        chat: bool,
        include_usage: bool,
        reset_after: int | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        completion_id = shapes.new_id("chatcmpl" if chat else "cmpl")
        created = int(time.time())
        use = shapes.usage(report.prompt_tokens, len(pieces), report.cached)
        events: list[dict[str, Any]] = []
        if chat:
            events.append(
                shapes.chat_chunk(completion_id, model, created,
                                  {"role": "assistant", "content": None if self.flavor == "llamacpp" else ""})
            )
            events += [shapes.chat_chunk(completion_id, model, created, {"content": p}) for p in pieces]
            events.append(shapes.chat_chunk(completion_id, model, created, {}, finish))
        else:
            events += [shapes.text_chunk(completion_id, model, created, p) for p in pieces]
            events.append(shapes.text_chunk(completion_id, model, created, "", finish))
        if include_usage:
            events.append(
                shapes.chat_chunk(completion_id, model, created, None, use=use)
                if chat
                else shapes.text_chunk(completion_id, model, created, None, use=use)
            )
        finish_index = len(events) - (2 if include_usage else 1)
        payloads: list[bytes] = []
        for index, event in enumerate(events):
            if index == finish_index and (self.kv is not None or self.flavor == "llamacpp"):
                event["timings"] = report.timings(len(pieces), self.chunk_latency_s * len(pieces))
            if index == finish_index and self.flavor == "vllm":
                event["choices"][0]["stop_reason"] = None
            payloads.append(b"data: " + _dumps(event).encode() + b"\n\n")
        payloads.append(b"data: [DONE]\n\n")
        try:
            for index, payload in enumerate(payloads):
                if reset_after is not None and index >= min(reset_after, len(events)):
                    _reset_connection(request)
                    return response
                if 0 < index <= len(pieces) + (1 if chat else 0) and self.chunk_latency_s > 0:
                    await asyncio.sleep(self.chunk_latency_s)
                await response.write(payload)
            if self.end_latency_s > 0:
                await asyncio.sleep(self.end_latency_s)
            await response.write_eof()
        except ConnectionResetError:  # the client went away mid-stream
            self.disconnects += 1
        return response


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m upstream_doubles.llm_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before response headers")
    parser.add_argument("--chunk-latency-ms", type=float, default=0.0, help="delay per generated piece")
    parser.add_argument(
        "--kv-blocks", type=int, default=0, help="KV cache capacity in blocks (0: no KV model)"
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.2)
    parser.add_argument("--prefill-overhead-ms", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args(argv)
    kv = (
        KVCacheModel(
            args.kv_blocks, args.block_size, args.prefill_ms_per_token / 1000, args.prefill_overhead_ms / 1000
        )
        if args.kv_blocks > 0
        else None
    )
    FakeLLM(
        model=args.model,
        embedding_dim=args.embedding_dim,
        latency_s=args.latency_ms / 1000,
        chunk_latency_s=args.chunk_latency_ms / 1000,
        kv=kv,
        slots=args.slots,
        host=args.host,
        port=args.port,
    ).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
