"""Micro-batching with a recording backend (a test double standing in for a model)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tiers.embedders.base import FloatArray
from tiers.embedders.batching import MicroBatcher


class RecordingBackend:
    """Test double of a model: a text's row is [len(text), index-in-call]; records every call."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.delay_s = delay_s
        self.fail = fail

    async def __call__(self, texts: list[str]) -> FloatArray:
        self.calls.append(texts)
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("model exploded")
        return np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)


async def test_same_tick_requests_share_one_call_and_duplicates_are_computed_once() -> None:
    backend = RecordingBackend()
    batcher = MicroBatcher(backend, max_batch=10)
    results = await asyncio.gather(batcher.embed(["aa"]), batcher.embed(["b", "aa"]), batcher.embed(["ccc"]))
    assert backend.calls == [["aa", "b", "ccc"]]
    assert [r[:, 0].tolist() for r in results] == [[2], [1, 2], [3]]


async def test_batches_never_exceed_max_batch_and_never_split_a_request() -> None:
    backend = RecordingBackend(delay_s=0.001)
    batcher = MicroBatcher(backend, max_batch=3)
    await asyncio.gather(*(batcher.embed([f"t{i}", f"u{i}"]) for i in range(5)), batcher.embed(["v"]))
    assert all(len(call) <= 3 for call in backend.calls)
    assert sorted(t for call in backend.calls for t in call) == sorted(
        [f"t{i}" for i in range(5)] + [f"u{i}" for i in range(5)] + ["v"]
    )
    assert all(("t" + c[1:] in call) for call in backend.calls for c in call if c.startswith("u"))


async def test_requests_arriving_during_a_call_form_the_next_batch() -> None:
    backend = RecordingBackend(delay_s=0.05)
    batcher = MicroBatcher(backend, max_batch=32)
    first = asyncio.create_task(batcher.embed(["first"]))
    await asyncio.sleep(0.01)
    later = [asyncio.create_task(batcher.embed([f"later{i}"])) for i in range(5)]
    await asyncio.gather(first, *later)
    assert backend.calls == [["first"], [f"later{i}" for i in range(5)]]


async def test_a_waiting_window_collects_requests_that_arrive_within_it() -> None:
    backend = RecordingBackend()
    batcher = MicroBatcher(backend, max_batch=32, max_wait_s=0.05)
    first = asyncio.create_task(batcher.embed(["first"]))
    await asyncio.sleep(0.005)
    second = asyncio.create_task(batcher.embed(["second"]))
    await asyncio.gather(first, second)
    assert backend.calls == [["first", "second"]]


async def test_a_failing_call_fails_every_request_of_its_batch_only() -> None:
    backend = RecordingBackend(fail=True)
    batcher = MicroBatcher(backend)
    results = await asyncio.gather(batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    backend.fail = False
    assert (await batcher.embed(["ok"]))[0, 0] == 2


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    backend = RecordingBackend(delay_s=0.02)
    batcher = MicroBatcher(backend)
    doomed = asyncio.create_task(batcher.embed(["doomed"]))
    survivor = asyncio.create_task(batcher.embed(["survivor"]))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await survivor)[0, 0] == len("survivor")
    with pytest.raises(asyncio.CancelledError):
        await doomed


async def test_close_cancels_queued_requests() -> None:
    backend = RecordingBackend(delay_s=1.0)
    batcher = MicroBatcher(backend)
    pending = asyncio.create_task(batcher.embed(["slow"]))
    await asyncio.sleep(0.01)
    await batcher.close()
    with pytest.raises(asyncio.CancelledError):
        await pending


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        MicroBatcher(RecordingBackend(), max_batch=0)
    with pytest.raises(ValueError):
        MicroBatcher(RecordingBackend(), max_wait_s=-1)
