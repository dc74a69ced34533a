"""The embedding contract: texts in, L2-normalized float32 rows out.

Every backend returns an array of shape ``(len(texts), dim)``, dtype float32, each row of unit length, so
that a dot product is the cosine similarity. ``name`` identifies the model (it belongs in any persisted
index's metadata: vectors of two models are not comparable).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Async sentence embedder."""

    @property
    def name(self) -> str:
        """Model identity, e.g. ``local:all-MiniLM-L6-v2``."""

    @property
    def dim(self) -> int:
        """Length of each embedding."""

    async def embed(self, texts: list[str]) -> FloatArray:
        """One L2-normalized float32 row per text, in order."""

    async def close(self) -> None:
        """Release threads, sessions and models."""


def normalize_rows(vectors: npt.ArrayLike) -> FloatArray:
    """``vectors`` as a 2-D float32 array whose non-zero rows have unit length."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    result: FloatArray = (array / np.maximum(norms, np.float32(1e-12))).astype(np.float32, copy=False)
    return result
