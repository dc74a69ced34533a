"""An LRU cache of embeddings in front of any :class:`~tiers.embedders.base.Embedder`.

Key: the text after :func:`text_key` — whitespace runs collapsed and ends stripped, which no tokenizer we
use distinguishes, and lower-cased when the model is uncased (``case_insensitive=True``, e.g.
all-MiniLM-L6-v2, whose tokenizer lower-cases anyway). So a cached row is exactly what the model would
return for the text.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from tiers.embedders.base import Embedder, FloatArray


def text_key(text: str, *, case_insensitive: bool) -> str:
    """The cache key of ``text``: whitespace collapsed, lower-cased when the model ignores case."""
    collapsed = " ".join(text.split())
    return collapsed.lower() if case_insensitive else collapsed


class CachedEmbedder:
    """Serves repeated texts from memory; misses of one call go to the inner embedder in one call."""

    def __init__(self, inner: Embedder, *, capacity: int = 10_000, case_insensitive: bool = False) -> None:
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self.inner = inner
        self.capacity = capacity
        self.case_insensitive = case_insensitive
        self._rows: OrderedDict[str, FloatArray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def __len__(self) -> int:
        return len(self._rows)

    async def embed(self, texts: list[str]) -> FloatArray:
        keys = [text_key(text, case_insensitive=self.case_insensitive) for text in texts]
        found: dict[str, FloatArray] = {}
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts, strict=True):
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
                found[key] = row
                self.hits += 1
            elif key not in missing:
                missing[key] = text
                self.misses += 1
        if missing:
            rows = await self.inner.embed(list(missing.values()))
            for key, row in zip(missing, rows, strict=True):
                found[key] = row
                self._remember(key, row)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[key] for key in keys])

    def _remember(self, key: str, row: FloatArray) -> None:
        if self.capacity == 0:
            return
        row.setflags(write=False)
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    async def close(self) -> None:
        self._rows.clear()
        await self.inner.close()
