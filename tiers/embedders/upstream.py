"""The ``upstream`` backend: an OpenAI-compatible ``POST /v1/embeddings`` endpoint, called through the proxy's one
upstream client (a :class:`~tiers.fetch.Fetcher`, given by the caller).

Concurrent requests are micro-batched into one HTTP call (the endpoint accepts a list of inputs). Rows are
put back in input order by their ``index`` and L2-normalized, whatever the server returns, so that dot
product = cosine. Failures raise :class:`UpstreamEmbeddingError`; the semantic tier treats that as a miss
(caches fail open).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from tiers.embedders.base import FloatArray, normalize_rows
from tiers.embedders.batching import MicroBatcher
from tiers.fetch import Fetcher


class UpstreamEmbeddingError(RuntimeError):
    """The embeddings endpoint failed or answered something unusable."""


class UpstreamEmbedder:
    """Embeddings from a remote OpenAI-compatible service."""

    case_insensitive = False

    def __init__(
        self,
        url: str,
        model: str,
        dim: int,
        *,
        client: Fetcher,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_batch: int = 64,
        max_wait_s: float = 0.001,
    ) -> None:
        """``url``: the full endpoint (``http://host:port/v1/embeddings``); ``dim``: the model's output length
        (checked against every answer); ``client``: the HTTP client (not closed here); ``timeout_s``: bound on one
        HTTP call."""
        self.url = url
        self.model = model
        self._dim = dim
        self._client = client
        self._headers = {"Content-Type": "application/json",
                         **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._timeout_s = timeout_s
        self._batcher = MicroBatcher(self._request, max_batch=max_batch, max_wait_s=max_wait_s)

    @property
    def name(self) -> str:
        return f"upstream:{self.model}"

    @property
    def dim(self) -> int:
        return self._dim

    async def embed(self, texts: list[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return await self._batcher.embed(texts)

    async def _request(self, texts: list[str]) -> FloatArray:
        payload = orjson.dumps({"model": self.model, "input": texts, "encoding_format": "float"})
        try:  # computing embeddings changes nothing: safe to resend on a connection the server had closed
            answer = await self._client.fetch("POST", self.url, headers=self._headers, body=payload,
                                              timeout_s=self._timeout_s, idempotent=True)
        except (OSError, ValueError) as error:
            raise UpstreamEmbeddingError(f"{self.url}: {error!r}") from error
        if answer.status != 200:
            detail = answer.body[:200].decode("utf-8", "replace")
            raise UpstreamEmbeddingError(f"{self.url} answered {answer.status}: {detail}")
        try:
            body: Any = answer.json()
        except ValueError as error:
            raise UpstreamEmbeddingError(f"{self.url}: the answer is not JSON ({error})") from error
        return self._rows(body, len(texts))

    def _rows(self, body: Any, expected: int) -> FloatArray:
        try:
            items = sorted(body["data"], key=lambda item: int(item["index"]))
            rows = np.asarray([item["embedding"] for item in items], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as error:
            raise UpstreamEmbeddingError(f"{self.url}: malformed embeddings answer ({error!r})") from error
        if rows.shape != (expected, self._dim):
            shape = f"{expected}x{self._dim}"
            raise UpstreamEmbeddingError(f"{self.url}: expected {shape} floats, got {rows.shape}")
        return normalize_rows(rows)

    async def close(self) -> None:
        await self._batcher.close()
