"""FakeReranker: test doubles of the common reranker servers (aiohttp), each in its own wire shape.

``flavor`` picks the server:

- ``"vllm"`` — vLLM serving a cross-encoder: ``POST /rerank``, ``/v1/rerank``, ``/v2/rerank`` answer
  ``{id, model, usage: {prompt_tokens, total_tokens}, results: [{index, document: {text, multi_modal},
  relevance_score}]}`` best first, cut to ``top_n`` (0: all); ``POST /score``, ``/v1/score`` take ``{model, text_1,
  text_2}`` (``text_1`` a string for every ``text_2``, or a list paired item by item) and answer ``{id, object:
  "list", created, model, data: [{index, object: "score", score}], usage}`` in request order;
- ``"tei"`` — text-embeddings-inference: ``POST /rerank`` takes ``{query, texts, raw_scores, return_text}`` and
  answers ``[{index, score, text?}]`` best first (``raw_scores``: logits instead of probabilities);
- ``"jina"`` — Jina's API: ``POST /v1/rerank`` answers ``{model, usage: {total_tokens}, results: [{index,
  document: {text}, relevance_score}]}``, the document unless ``return_documents`` is false, cut to ``top_n``;
- ``"cohere"`` — Cohere v2: ``POST /v2/rerank`` answers ``{id, results: [{index, relevance_score}], meta:
  {api_version, billed_units: {search_units}}}``, cut to ``top_n``.

Scores are deterministic (:func:`score`): the share of the query's words found in the document, plus a small
hash-derived part so no two documents tie. Documents may be strings or objects with ``text`` (vLLM, Jina). ``log``
records every request; ``GET /v1/models`` and ``/health`` answer for the proxy's health probe.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from proxy.core.loopback import LOOPBACK
from upstream_doubles.served_app import ServedApp


def score(query: str, document: str) -> float:
    """A relevance probability in (0, 1): word overlap, plus a hash part that breaks ties."""
    words = set(query.lower().split())
    found = len(words & set(document.lower().split())) / max(1, len(words))
    jitter = int.from_bytes(hashlib.sha256(f"{query}\x00{document}".encode()).digest()[:4], "big") / 2**32
    return round(0.05 + 0.85 * found + 0.09 * jitter, 6)


def _tokens(*texts: str) -> int:
    return sum(len(text.split()) for text in texts)


def _text(document: Any) -> str:
    return document["text"] if isinstance(document, dict) else str(document)


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": None}}, status=status)


class FakeReranker(ServedApp):
    """A reranker server of one ``flavor`` (see the module docstring)."""

    def __init__(self, flavor: str = "vllm", *, model: str = "fake-reranker", host: str = LOOPBACK,
                 port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.flavor = flavor
        self.model = model

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._models)
        if self.flavor == "vllm":
            for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
                app.router.add_post(path, self._rerank)
            for path in ("/score", "/v1/score"):
                app.router.add_post(path, self._score)
        elif self.flavor == "tei":
            app.router.add_post("/rerank", self._tei)
        else:
            app.router.add_post("/v2/rerank" if self.flavor == "cohere" else "/v1/rerank", self._rerank)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _rerank(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return _error("query must be a string and documents a non-empty list")
        scored = sorted(((score(query, _text(d)), i, d) for i, d in enumerate(documents)), key=lambda s: -s[0])
        top_n = body.get("top_n") or 0
        if top_n:
            scored = scored[:top_n]
        tokens = _tokens(*(query + " " + _text(d) for d in documents))
        model = body.get("model") or self.model
        if self.flavor == "vllm":
            results = [{"index": i, "document": {"text": _text(d), "multi_modal": None}, "relevance_score": s}
                       for s, i, d in scored]
            return web.json_response({"id": f"rerank-{uuid.uuid4().hex}", "model": model,
                                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                                      "results": results})
        if self.flavor == "jina":
            shown = body.get("return_documents", True) is not False
            results = [{"index": i, **({"document": {"text": _text(d)}} if shown else {}), "relevance_score": s}
                       for s, i, d in scored]
            return web.json_response({"model": model, "usage": {"total_tokens": tokens}, "results": results})
        results = [{"index": i, "relevance_score": s} for s, i, _ in scored]
        return web.json_response({"id": str(uuid.uuid4()), "results": results,
                                  "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}})

    async def _score(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        first, second = body.get("text_1"), body.get("text_2")
        seconds = second if isinstance(second, list) else [second]
        firsts = first if isinstance(first, list) else [first] * len(seconds)
        if len(firsts) != len(seconds) or not all(isinstance(t, str) for t in [*firsts, *seconds]):
            return _error("text_1 and text_2 must be strings, or lists of the same length")
        tokens = _tokens(*firsts, *seconds)
        return web.json_response({
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": body.get("model") or self.model,
            "data": [{"index": i, "object": "score", "score": score(q, d)}
                     for i, (q, d) in enumerate(zip(firsts, seconds, strict=True))],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None},
        })

    async def _tei(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        query, texts = body.get("query"), body.get("texts")
        if not isinstance(query, str) or not isinstance(texts, list) or not texts:
            return web.json_response({"error": "`texts` cannot be empty", "error_type": "Validation"}, status=422)
        raw = body.get("raw_scores", False)
        results = []
        for i, text in enumerate(texts):
            probability = score(query, text)
            value = math.log(probability / (1 - probability)) if raw else probability
            results.append({"index": i, "score": value, **({"text": text} if body.get("return_text") else {})})
        return web.json_response(sorted(results, key=lambda r: -r["score"]))
