"""Distances between query vectors, in the collection's own metric, and what a tolerance means for each.

A cached search answers a new one when the two query vectors are within ``tolerance``:

- ``Cosine``: ``1 - cos(q, c)`` (Qdrant normalizes Cosine vectors, so only direction matters);
- ``Euclid``: ``||q - c||_2``;
- ``Manhattan``: ``||q - c||_1``;
- ``Dot``: ``||q - c||_2``. A dot product is not a distance; the Euclidean distance of the query vectors is
  what bounds the change of every score (``|q·x - c·x| <= ||q - c|| * ||x||``), and it keeps the vectors'
  scale, which a Dot collection's scores (and ``score_threshold``) depend on.

Euclid/Dot/Manhattan tolerances are absolute, in the data's own units, so there is no universal default for
them; :func:`unit_vector_tolerance` converts a Cosine tolerance for collections that hold unit-length vectors
(``||q - c||_2 = sqrt(2 * (1 - cos))`` there).

Candidates are kept as rows of a float32 matrix; Cosine rows are stored normalized so a distance is one
mat-vec.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from normalizer.search_request import Distance

FloatMatrix = npt.NDArray[np.float32]
FloatVector = npt.NDArray[np.float32]


def prepare(metric: Distance, vector: FloatVector) -> FloatVector:
    """The form in which ``vector`` is stored and compared (unit length for Cosine, unchanged otherwise)."""
    if metric is Distance.COSINE:
        norm = float(np.linalg.norm(vector))
        return (vector / norm).astype(np.float32) if norm > 0 else vector
    return vector


def distances(metric: Distance, rows: FloatMatrix, query: FloatVector) -> npt.NDArray[np.float32]:
    """Distance from ``query`` (already :func:`prepare`d) to each row."""
    if metric is Distance.COSINE:
        return np.asarray(1.0 - rows @ query, dtype=np.float32)
    if metric is Distance.MANHATTAN:
        return np.asarray(np.abs(rows - query).sum(axis=1), dtype=np.float32)
    return np.asarray(np.linalg.norm(rows - query, axis=1), dtype=np.float32)


def unit_vector_tolerance(metric: Distance, cosine_tolerance: float) -> float:
    """The tolerance in ``metric`` equal to ``cosine_tolerance`` for unit-length vectors (not Manhattan)."""
    if metric is Distance.COSINE:
        return cosine_tolerance
    if metric in (Distance.EUCLID, Distance.DOT):
        return math.sqrt(2.0 * cosine_tolerance)
    raise ValueError("a Manhattan distance has no fixed relation to a cosine distance; set it per collection")
