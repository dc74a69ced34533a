"""L2, the semantic tier: reuse an LLM response for a differently worded but equivalent question.

A match needs all of:

1. the same tenant, namespace and :class:`~normalizer.signature.ContextSignature` digest (model, system
   prompt, tools, sampling class, earlier turns, documents, knowledge version...). Each such triple is one
   partition of the vector store, so a search never even sees another context's questions;
2. cosine similarity of the final user questions' embeddings ≥ the namespace's threshold;
3. no guard veto (:func:`normalizer.guards.veto`: numbers, dates, negations, quoted strings... that differ).

The tier stores no response bytes. Each vector's id is the **entry key** (the L1 key under which the
response is kept in a :class:`~tiers.storage.KeyValueStore`), and its payload holds the original question
text so that guards can compare it with the new one::

    partition  "<tenant>\\x1f<namespace>\\x1f<signature digest>"
               "<tenant>\\x1f<namespace>~<user digest>\\x1f<signature digest>"   (user-scoped: private namespaces)
    id         entry key (L1 key of the response)
    payload    {"question": <original final user question>}

Up to ``candidates`` nearest questions above the threshold are examined, most similar first; the first that
no guard vetoes is the match (a vetoed nearest neighbour must not hide an equivalent one just behind it).
Choosing is a pure function, :func:`choose_match`; :class:`SemanticTier` is the thin async part around it.
Defaults (threshold, guards) come from ``python -m loadtest.bench semantic`` on the NQ-open paraphrase
workload; see :data:`DEFAULT_THRESHOLD` and :data:`DEFAULT_GUARDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from normalizer.guards import veto as guard_veto
from tiers.embedders.base import Embedder
from tiers.latency import LatencyHistogram
from tiers.vectors.base import VectorHit, VectorStore

Veto = Callable[[str, str, Iterable[str]], "str | None"]

DEFAULT_THRESHOLD = 0.80
"""Cosine threshold chosen by the semantic benchmark (see BENCHMARKS.md): with the default guards, 0.75 to 0.82 all
keep wrong hits at zero on the NQ-open workload; 0.80 leaves a margin above the lowest."""

DEFAULT_GUARDS: tuple[str, ...] = ("numbers", "quantities", "dates", "negations", "content_words")
"""Guards on by default; each one's effect is measured by the semantic benchmark. ``units``, ``quoted`` and
``entities`` are available but off: the (lower-case, unquoted) benchmark workload never exercises them."""

_SEPARATOR = "\x1f"


@dataclass(frozen=True, slots=True)
class SemanticScope:
    """Who asked: matches never cross tenants or namespaces, nor users when ``user`` (a user digest) is set."""

    tenant: str
    namespace: str = "default"
    user: str = ""

    @property
    def label(self) -> str:
        """The namespace as partitions name it: ``<namespace>~<user>`` when user-scoped (namespace names cannot
        contain ``~``, ``normalizer.cache_control.NAMESPACE_PATTERN``, so this never names another namespace)."""
        return f"{self.namespace}~{self.user}" if self.user else self.namespace


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    """A cached answer for an equivalent question: its entry key, similarity and original question."""

    key: str
    similarity: float
    question: str


@dataclass(slots=True)
class SemanticStats:
    """Counters for metrics: lookups, hits, misses below threshold, vetoes by guard."""

    lookups: int = 0
    hits: int = 0
    below_threshold: int = 0
    errors: int = 0
    """Lookups that failed (model or vector store down): the request went on as a miss."""
    vetoes: dict[str, int] = field(default_factory=dict)
    lookup_seconds: LatencyHistogram = field(default_factory=LatencyHistogram)
    """How long each lookup took, the embedding included."""


def partition_of(scope: SemanticScope, signature_digest: str) -> str:
    """The vector-store partition of a tenant, namespace (and user, :attr:`SemanticScope.label`) and context
    signature."""
    return _SEPARATOR.join((scope.tenant, scope.label, signature_digest))


def choose_match(
    question: str,
    candidates: Sequence[VectorHit],
    threshold: float,
    guards: Iterable[str],
    veto: Veto = guard_veto,
    on_veto: Callable[[str], None] | None = None,
) -> SemanticMatch | None:
    """The most similar candidate at or above ``threshold`` that no enabled guard vetoes, else ``None``.

    ``on_veto`` is called with each veto reason (for metrics).
    """
    enabled = tuple(guards)
    for hit in sorted(candidates, key=lambda c: c.similarity, reverse=True):
        if hit.similarity < threshold:
            return None
        original = str(hit.payload.get("question", ""))
        reason = veto(question, original, enabled) if enabled else None
        if reason is None:
            return SemanticMatch(hit.id, hit.similarity, original)
        if on_veto is not None:
            on_veto(reason)
    return None


class SemanticTier:
    """Finds and records equivalent questions; response bytes live elsewhere under the entry key."""

    def __init__(
        self,
        embedder: Embedder,
        store: VectorStore,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        namespace_thresholds: Mapping[str, float] | None = None,
        guards: Iterable[str] = DEFAULT_GUARDS,
        candidates: int = 4,
        veto: Veto = guard_veto,
    ) -> None:
        """``threshold``: default cosine threshold; ``namespace_thresholds``: per-namespace overrides;
        ``guards``: names of the enabled guards (see :mod:`normalizer.guards`); ``candidates``: neighbours
        examined per lookup; ``veto``: the guard function (injectable for experiments)."""
        if embedder.dim != store.dim:
            raise ValueError(f"embedder dim {embedder.dim} != vector store dim {store.dim}")
        self.embedder = embedder
        self.store = store
        self.threshold = threshold
        self.namespace_thresholds = dict(namespace_thresholds or {})
        self.guards = tuple(guards)
        veto("", "", self.guards)  # unknown guard names fail here, at start-up
        self.candidates = max(1, candidates)
        self.veto = veto
        self.stats = SemanticStats()

    def threshold_for(self, namespace: str) -> float:
        """The cosine threshold of ``namespace``."""
        return self.namespace_thresholds.get(namespace, self.threshold)

    async def lookup(self, scope: SemanticScope, signature_digest: str, question: str) -> SemanticMatch | None:
        """An equivalent cached question under the same context, or ``None``."""
        self.stats.lookups += 1
        started = time.perf_counter()
        try:
            return await self._lookup(scope, signature_digest, question)
        except Exception:
            self.stats.errors += 1
            raise
        finally:
            self.stats.lookup_seconds.observe(time.perf_counter() - started)

    async def _lookup(self, scope: SemanticScope, signature_digest: str, question: str) -> SemanticMatch | None:
        partition = partition_of(scope, signature_digest)
        if await self.store.count(partition) == 0:
            return None
        [vector] = await self.embedder.embed([question])
        hits = await self.store.search(partition, vector, k=self.candidates)
        match = choose_match(
            question, hits, self.threshold_for(scope.namespace), self.guards, self.veto, self._count_veto
        )
        if match is not None:
            self.stats.hits += 1
        elif not hits or hits[0].similarity < self.threshold_for(scope.namespace):
            self.stats.below_threshold += 1
        return match

    def _count_veto(self, reason: str) -> None:
        guard = reason.split(":", 1)[0]
        self.stats.vetoes[guard] = self.stats.vetoes.get(guard, 0) + 1

    async def add(self, scope: SemanticScope, signature_digest: str, question: str, entry_key: str) -> None:
        """Record that ``entry_key`` answers ``question`` under this scope and context."""
        [vector] = await self.embedder.embed([question])
        await self.store.add(
            partition_of(scope, signature_digest), [entry_key], vector[None, :].astype(np.float32),
            [{"question": question}],
        )  # fmt: skip

    async def delete(self, entry_keys: Sequence[str]) -> int:
        """Forget entries (their responses were evicted or invalidated); the number that existed."""
        return await self.store.delete(entry_keys)

    async def delete_context(self, scope: SemanticScope, signature_digest: str) -> int:
        """Forget every question recorded under one scope and context signature."""
        return await self.store.delete_partition(partition_of(scope, signature_digest))
