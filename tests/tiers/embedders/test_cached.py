"""The embedding LRU in front of a counting backend (a test double of an embedder)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tiers.embedders.base import FloatArray, normalize_rows
from tiers.embedders.cached import CachedEmbedder, text_key


class CountingEmbedder:
    """Test double: a deterministic unit vector per text; counts the texts it was asked for."""

    name = "counting"
    dim = 8

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def embed(self, texts: list[str]) -> FloatArray:
        self.asked.extend(texts)
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(self.dim) for t in texts]
        return normalize_rows(np.array(rows).reshape(len(texts), self.dim))

    async def close(self) -> None:
        pass


async def test_repeats_and_equivalent_spellings_are_served_from_memory() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, case_insensitive=True)
    first = await cached.embed(["What is  DNA? ", "b"])
    again = await cached.embed(["what is dna?", "What is DNA?", "c"])
    assert inner.asked == ["What is  DNA? ", "b", "c"]
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(again[0], again[1])
    assert (cached.hits, cached.misses) == (2, 3)


async def test_case_matters_for_cased_models() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner)
    await cached.embed(["Apple", "apple"])
    assert inner.asked == ["Apple", "apple"]


async def test_least_recently_used_texts_are_evicted_first() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, capacity=2)
    await cached.embed(["a"])
    await cached.embed(["b"])
    await cached.embed(["a"])  # a is now the most recent
    await cached.embed(["c"])  # evicts b
    await cached.embed(["a", "b"])
    assert inner.asked == ["a", "b", "c", "b"]
    assert len(cached) == 2


async def test_duplicates_within_one_call_are_embedded_once_and_rows_stay_in_order() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, capacity=0)
    rows = await cached.embed(["x", "y", "x"])
    assert inner.asked == ["x", "y"]
    np.testing.assert_array_equal(rows[0], rows[2])
    assert (await cached.embed([])).shape == (0, 8)


@given(st.text())
def test_keys_ignore_whitespace_layout(text: str) -> None:
    spaced = "  " + text.replace(" ", " \t ") + "\n"
    assert text_key(spaced, case_insensitive=False) == text_key(text, case_insensitive=False)
