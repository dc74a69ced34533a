"""The vector-search cache (Proximity): reuse a Qdrant search result for a query vector within a tolerance.

- :mod:`tiers.retrieval.cache` — ``RetrievalCache``, the async driver the Qdrant route calls (usage in its
  docstring);
- :mod:`tiers.retrieval.index` — ``ProximityIndex``, the pure decisions (match, admit, invalidate);
- :mod:`tiers.retrieval.partition` — the cached query vectors of one partition (linear scan, why there);
- :mod:`tiers.retrieval.distance` — distances per Qdrant metric and what a tolerance means;
- :mod:`tiers.retrieval.batch` — split a batch into hits and misses and reassemble the answer;
- :mod:`tiers.retrieval.writes` — which cached searches a Qdrant write invalidates.

Requests are parsed by :mod:`normalizer.search_request`.
"""

from tiers.retrieval.cache import RetrievalCache, SearchPlan
from tiers.retrieval.index import DEFAULT_COSINE_TOLERANCE, Admission, Match, ProximityIndex
from tiers.retrieval.writes import WriteEffect, WriteScope, write_effects

__all__ = [
    "DEFAULT_COSINE_TOLERANCE",
    "Admission",
    "Match",
    "ProximityIndex",
    "RetrievalCache",
    "SearchPlan",
    "WriteEffect",
    "WriteScope",
    "write_effects",
]
