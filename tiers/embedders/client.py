"""The vector a client sent itself (a Qdrant search carries its query vector): no model involved."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tiers.embedders.base import FloatArray, normalize_rows


def client_vector(values: Sequence[float], *, normalize: bool = False) -> FloatArray:
    """``values`` as a 1-D float32 array; unit length when ``normalize`` (only meaningful for cosine metrics).

    Raises ``ValueError`` for an empty, non-finite or non-flat vector.
    """
    array = np.asarray(values, dtype=np.float32)
    if array.ndim != 1 or array.size == 0:
        raise ValueError("a query vector must be a non-empty flat list of numbers")
    if not np.all(np.isfinite(array)):
        raise ValueError("a query vector must contain only finite numbers")
    return normalize_rows(array)[0] if normalize else array
