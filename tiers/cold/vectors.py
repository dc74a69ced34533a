"""Brute-force nearest-neighbour search over float16 vectors held in memory (the cold tier's semantic side).

L3 keeps each entry's embedding as float16 bytes (2 bytes per dimension) so that a semantic miss in L2 can
still find a match among the cold entries. The matrix is rebuilt from the database the first time it is
searched and kept in step with writes afterwards; rows are L2-normalized, so a dot product is the cosine
similarity. Brute force with numpy is exact and fast enough for the sizes a cold tier sees on one node (1e5
vectors x 384 dims: a few ms); an approximate index belongs to L2.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


def to_float16_bytes(vector: Iterable[float] | npt.NDArray[np.floating]) -> bytes:
    """The compact stored form: L2-normalized float16, little-endian."""
    array = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(array))
    if norm > 0:
        array = array / norm
    return array.astype("<f2").tobytes()


def from_float16_bytes(data: bytes) -> Vector:
    return np.frombuffer(data, dtype="<f2").astype(np.float32)


class VectorIndex:
    """Keys and their float16 vectors; exact cosine top-k."""

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim
        self._keys: list[str] = []
        self._rows: dict[str, int] = {}
        self._matrix = np.zeros((0, dim or 0), dtype=np.float16)

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: str, stored: bytes) -> None:
        row = np.frombuffer(stored, dtype="<f2")
        if self.dim is None:
            self.dim = row.size
            self._matrix = np.zeros((0, self.dim), dtype=np.float16)
        if row.size != self.dim:
            raise ValueError(f"vector has {row.size} dimensions, the index {self.dim}")
        index = self._rows.get(key)
        if index is not None:
            self._matrix[index] = row
            return
        if len(self._keys) == self._matrix.shape[0]:
            grown = np.zeros((max(64, 2 * len(self._keys)), self.dim), dtype=np.float16)
            grown[: len(self._keys)] = self._matrix[: len(self._keys)]
            self._matrix = grown
        self._rows[key] = len(self._keys)
        self._matrix[len(self._keys)] = row
        self._keys.append(key)

    def remove(self, key: str) -> None:
        index = self._rows.pop(key, None)
        if index is None:
            return
        last = len(self._keys) - 1
        if index != last:
            moved = self._keys[last]
            self._keys[index] = moved
            self._rows[moved] = index
            self._matrix[index] = self._matrix[last]
        self._keys.pop()

    def clear(self) -> None:
        self._keys.clear()
        self._rows.clear()

    def nearest(self, query: bytes, k: int, allowed: Collection[str] | None = None) -> list[tuple[str, float]]:
        """Up to ``k`` (key, cosine similarity) pairs, best first; only keys in ``allowed`` when given."""
        if not self._keys or k <= 0:
            return []
        probe = from_float16_bytes(query)
        if probe.size != self.dim:
            raise ValueError(f"query has {probe.size} dimensions, the index {self.dim}")
        if allowed is None:
            rows = np.arange(len(self._keys))
        else:
            rows = np.fromiter((self._rows[key] for key in allowed if key in self._rows), dtype=np.int64)
            if rows.size == 0:
                return []
        scores = self._matrix[rows].astype(np.float32) @ probe
        top = min(k, rows.size)
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best])]
        return [(self._keys[int(rows[i])], float(scores[i])) for i in best]
