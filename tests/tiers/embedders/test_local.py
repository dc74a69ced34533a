"""The local backend: loads off the event loop, once; batches concurrent requests."""

from __future__ import annotations

import asyncio

import numpy as np

from tiers.embedders.local import LocalEmbedder
from tiers.embedders.minilm import MiniLMEncoder


async def test_loading_does_not_block_the_event_loop_and_happens_once() -> None:
    embedder = LocalEmbedder()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    first, second = await asyncio.gather(embedder.embed(["hello there"]), embedder.embed(["general kenobi"]))
    ticker.cancel()
    assert ticks > 3  # the loop kept running while ~90 MB of weights loaded
    assert first.shape == second.shape == (1, 384)
    assert embedder._encoder is not None
    await embedder.close()


async def test_concurrent_requests_share_model_calls(encoder: MiniLMEncoder) -> None:
    embedder = LocalEmbedder(encoder=encoder, max_batch=8)
    questions = [f"question number {i}" for i in range(24)]
    rows = await asyncio.gather(*(embedder.embed([q]) for q in questions))
    assert embedder.batches <= 4  # 24 requests, at most 8 texts per call
    expected = encoder.encode(questions)
    for row, want in zip(rows, expected, strict=True):
        assert float(row[0] @ want) >= 1 - 1e-5
    await embedder.close()


async def test_embed_returns_unit_rows_in_order(encoder: MiniLMEncoder) -> None:
    embedder = LocalEmbedder(encoder=encoder)
    rows = await embedder.embed(["b", "a", "b"])
    assert rows.shape == (3, 384) and rows.dtype == np.float32
    np.testing.assert_allclose(rows[0], rows[2])
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert (await embedder.embed([])).shape == (0, 384)
    assert embedder.name == "local:all-MiniLM-L6-v2" and embedder.dim == 384
    await embedder.close()
