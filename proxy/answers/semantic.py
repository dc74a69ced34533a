"""L2 lookup: answer a differently worded but equivalent question from the semantic tier.

Only chat and Responses API requests whose final message (input item) is a user question take part (read by the
endpoint's :class:`~normalizer.signature.PromptReading`). Everything but that question and its documents must
match exactly (the :class:`~normalizer.signature.ContextSignature` digest, computed under the same knowledge version
as the exact key); the question is compared by embedding under the namespace's threshold, with guards vetoing false
friends, and the documents read by :class:`~proxy.core.prompt.ReadPrompt` must still carry what the cached answer
rests on (:mod:`normalizer.evidence`; kept in the answer's entry, from the answer and the documents in the order the
upstream saw them, and read from there for the candidates when the new prompt carries documents: one copy, which
goes with its entry). An answer that cites by position is served with its positions rewritten to where
the new prompt holds the documents, and promoted so. It runs
after the exact tiers (L1, L3 by key): an exact repeat never costs an embedding. A match points at an entry key;
the response bytes come from L1, or from L3 when L1 has let it go. Candidates come from the L2 index and, when it
has none that can serve, from the cold tier's stored question vectors; one decision
(:meth:`~tiers.semantic.SemanticTier.decide`) chooses among both, so a would-be hit drawn for verification is
forwarded and compared whichever tier holds its answer, and every semantic hit is counted once. The hit is promoted
into L1 under the new request's own key. On a miss, the question is recorded against the new entry's key once the
upstream answer has been stored, and the answer's words teach the answer check
(:class:`~tiers.calibration.AnswerAgreement`).

The lines an app's prompt template repeats around its questions are left out of the question compared
(:class:`~tiers.question_templates.QuestionTemplates`, learnt per namespace, one for every endpoint:
:meth:`SemanticTier.question`); the question as asked goes along (``asked``, kept with the entry when it differs), so
that a line where two questions differ is weighed before a hit serves (:mod:`tiers.question_lines`).

In a user-scoped (private) request the index partition and the cold tier's signature tag carry the key scope's
user digest too, so a paraphrase never reaches another user's answer.

``X-Cache-Similarity`` is sent only when ``cache.semantic.expose_similarity`` is on (it tells a tenant how close
its question came to someone else's).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from normalizer.canonical_json import CanonicalizationError
from normalizer.evidence import renumbered
from normalizer.signature import PromptReading
from proxy.answers.replies import (
    FOLLOWER,
    SEMANTIC,
    SemanticQuery,
    answer_evidence,
    complete_body,
    entry_tags,
    hit_reply,
)
from proxy.core.context import FinishCallback, Reply, RequestContext
from proxy.core.endpoints import Endpoint
from proxy.core.outcome import MISS_STATUSES, SEMANTIC_TIER, CacheStatus, Matched, Outcome
from proxy.core.pipeline import Named, Next
from tiers.calibration import GRID
from tiers.embedders.base import FloatArray
from tiers.entry import CachedResponse
from tiers.response_tier import ResponseTier
from tiers.semantic import (
    CandidateSource,
    EvidenceReader,
    SemanticMatch,
    SemanticScope,
    SemanticTier,
    answer_text,
    asked_payload,
    edit_answer_text,
)
from tiers.vectors.base import VectorHit

log = logging.getLogger("ragproxy.semantic")


@runtime_checkable
class QuestionVectorStore(Protocol):
    """A store that keeps each answer's question vector and searches them (the cold tier's)."""

    async def nearest(self, vector: FloatArray, k: int = 1, *, tag: str | None = None) -> list[tuple[str, float]]:
        """Up to ``k`` (key, cosine similarity), best first, among entries carrying ``tag``."""


@dataclass(frozen=True, slots=True)
class QuestionVectors:
    """An answer tier and its store's search of question vectors."""

    tier: ResponseTier
    store: QuestionVectorStore


def question_vectors(tiers: Sequence[ResponseTier]) -> QuestionVectors | None:
    """The answer tier whose store keeps question vectors (found by what it can do, not where it stands)."""
    for tier in tiers:
        if isinstance(tier.store, QuestionVectorStore):
            return QuestionVectors(tier, tier.store)
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def signature_tag(where: SemanticScope, digest: str) -> str:
    """The tag that keeps the cold tier's question-vector search inside one scope and context."""
    return f"sig:{where.tenant}/{where.label}/{digest}"


class SemanticLookup:
    """Serve semantic hits; teach the index on misses."""

    name = SEMANTIC_TIER
    needs = frozenset({"cache_key", "key_scope", "key_variant", "cache_policy", "prompt"})
    gives: frozenset[Named] = frozenset({SEMANTIC, "entry", "outcome"})
    reads_if_given: frozenset[Named] = frozenset({"outcome", FOLLOWER})

    def __init__(self, semantic: SemanticTier, sources: Sequence[ResponseTier], promote_into: ResponseTier,
                 *, expose_similarity: bool = False, cold: QuestionVectors | None = None,
                 endpoint: Endpoint) -> None:
        """``sources``: the answer tiers a match's key is read from, fastest first; ``cold``: an answer tier that
        also keeps its questions' vectors (searched for candidates when this tier's index has none that can serve);
        ``endpoint``: how its requests are read (:attr:`~proxy.core.endpoints.Endpoint.reading`), and its answers
        assembled."""
        if endpoint.reading is None:
            raise ValueError(f"the {endpoint.route} endpoint is not looked up by meaning")
        self.semantic = semantic
        self.reading: PromptReading = endpoint.reading
        self.endpoint = endpoint
        self.sources = tuple(sources)
        self.promote_into = promote_into
        self.expose_similarity = expose_similarity
        self.cold = cold

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key, scope, policy, prompt = ctx.cache_key, ctx.key_scope, ctx.cache_policy, ctx.prompt
        body = ctx.body or {}
        if key is None or scope is None or policy is None or prompt is None:
            return await call_next(ctx)
        question = self.reading.question(body, prompt)
        if question is None:
            return await call_next(ctx)
        try:
            signature = self.reading.signature(body, prompt, scope.knowledge_version, ctx.key_variant)
        except CanonicalizationError:
            return await call_next(ctx)
        if signature is None:
            return await call_next(ctx)
        where = SemanticScope(scope.tenant, scope.namespace, scope.user)
        asked, question = question, self.semantic.question(where, question)
        query = SemanticQuery(question, where, signature.digest, signature_tag(where, signature.digest),
                              asked=asked, instructions=self.reading.instructions(body, prompt))
        ctx.handoffs[SEMANTIC] = query
        probe: SemanticMatch | None = None
        if policy.may_read:
            reply, probe = await self._lookup(ctx, query, key)
            if reply is not None:
                return reply
        reply = await call_next(ctx)
        if probe is not None:
            reply.on_finish(self._comparison(where, probe, asked, query.instructions))
        if policy.may_store and not ctx.handoffs.get(FOLLOWER):
            async def learn(done: Reply, ok: bool, body_bytes: bytes) -> None:
                if ok and done.status == 200 and (ctx.outcome is None or ctx.outcome.status in MISS_STATUSES):
                    complete = complete_body(done, body_bytes, self.endpoint)
                    answer = answer_text(complete.body) if complete is not None else None
                    if answer is not None:
                        self.semantic.learn_answer(answer, where, asked)
                    try:
                        await self.semantic.add(where, query.digest, question, key, asked)
                    except Exception as exc:  # fail open: the index is an optimisation
                        self.semantic.stats.index_errors += 1
                        log.warning("semantic index add failed: %s", exc)

            reply.on_finish(learn)
        return reply

    def _cold_candidates(self, query: SemanticQuery, key: str,
                         found: dict[str, CachedResponse]) -> CandidateSource | None:
        """The cold tier's stored questions of the same context nearest to the question (their entries kept in
        ``found``, so a match is not read twice); fails open."""
        cold = self.cold
        if cold is None:
            return None

        async def candidates(vector: FloatArray) -> list[VectorHit]:
            try:
                nearest = await cold.store.nearest(vector, self.semantic.candidates, tag=query.tag)
                hits = []
                for candidate, similarity in nearest:
                    if candidate == key or similarity < GRID[0]:
                        continue
                    entry = await cold.tier.get(candidate)
                    if entry is not None:
                        found[candidate] = entry
                        hits.append(VectorHit(candidate, similarity, {
                            **asked_payload(str(entry.meta.get("question", "")), _text(entry.meta.get("asked"))),
                            "source": cold.tier.name, "evidence": entry.meta.get("evidence")}))
                return hits
            except Exception as exc:  # fail open
                self.semantic.stats.index_errors += 1
                log.warning("cold semantic lookup failed: %s", exc)
                return []

        return candidates

    def _evidence(self, found: dict[str, CachedResponse]) -> EvidenceReader:
        """Each candidate's evidence from its entry (kept in ``found``, so a match is not read twice); a candidate
        whose answer is gone from every tier is dropped, and forgotten by the index."""
        async def read(hits: Sequence[VectorHit]) -> list[VectorHit]:
            kept, gone = [], []
            for hit in hits:
                entry = found.get(hit.id) or await self._entry(hit.id)
                if entry is None:
                    gone.append(hit.id)
                    continue
                found[hit.id] = entry
                kept.append(VectorHit(hit.id, hit.similarity, {**hit.payload, "evidence": entry.meta.get("evidence")}))
            if gone:
                await self.semantic.delete(gone)
            return kept

        return read

    async def _entry(self, key: str) -> CachedResponse | None:
        """The answer under ``key`` from the fastest source holding it."""
        for tier in self.sources:
            entry = await tier.get(key)
            if entry is not None:
                return entry
        return None

    def _comparison(self, where: SemanticScope, probe: SemanticMatch, question: str,
                    instructions: str) -> FinishCallback:
        """After forwarding: compare the fresh answer to ``question`` (as asked; ``instructions``: what else the
        request told the model) with the one cached for ``probe`` (calibration evidence), in the background
        (:meth:`SemanticTier.compare_later`)."""
        async def compare(done: Reply, ok: bool, body_bytes: bytes) -> None:
            complete = complete_body(done, body_bytes, self.endpoint) if ok and done.status == 200 else None
            fresh = answer_text(complete.body) if complete is not None else None
            if fresh is None:
                return

            async def comparison() -> None:
                for tier in self.sources:
                    entry = await tier.get(probe.key)
                    cached = answer_text(entry.body) if entry is not None else None
                    if cached is not None:
                        self.semantic.compare(where, probe, cached, fresh, question, (instructions,))
                        return

            self.semantic.compare_later(comparison)

        return compare

    @staticmethod
    def _renumbered(ctx: RequestContext, entry: CachedResponse, match: SemanticMatch,
                    question: str) -> CachedResponse:
        """``entry`` with its answer's positional citations pointing where the new prompt holds the documents
        (:func:`normalizer.evidence.renumbered`), and the evidence that answer to ``question`` now has."""
        documents = ctx.prompt.documents if ctx.prompt is not None else ()
        body = edit_answer_text(entry.body, lambda text: renumbered(text, match.evidence, documents))
        if body is entry.body:
            return entry
        rests_on = answer_evidence(ctx, answer_text(body), question)
        return replace(entry, body=body, meta={**entry.meta, "evidence": rests_on})

    async def _lookup(self, ctx: RequestContext, query: SemanticQuery,
                      key: str) -> tuple[Reply | None, SemanticMatch | None]:
        """A semantic hit, or a miss with the candidate whose answer to compare with the fresh one."""
        assert ctx.cache_policy is not None
        found: dict[str, CachedResponse] = {}
        try:
            decision = await self.semantic.decide(query.where, query.digest, query.question,
                                                  self._cold_candidates(query, key, found), ctx.prompt.documents
                                                  if ctx.prompt is not None else (), self._evidence(found),
                                                  query.asked)
        except Exception as exc:  # embedding model or vector store down: fail open (counted by the tier)
            log.warning("semantic lookup failed: %s", exc)
            return None, None
        query.vector = decision.vector
        match = decision.match
        if match is None:
            return None, decision.probe
        policy = ctx.cache_policy
        entry = found.get(match.key) or await self._entry(match.key)
        if entry is None:
            await self.semantic.delete([match.key])  # the answer it pointed at is gone
            return None, None
        if (policy.max_age is not None and entry.age() > policy.max_age) \
                or not self.endpoint.carries(entry, ctx.body or {}, ctx.stream):
            return None, None
        entry = self._renumbered(ctx, entry, match, query.question)
        await self.promote_into.put(key, entry, ttl=policy.ttl, tags=entry_tags(ctx, entry.model))
        self.semantic.served()
        extra = {"X-Cache-Similarity": f"{match.similarity:.4f}"} if self.expose_similarity else None
        outcome = Outcome(CacheStatus.SEMANTIC_HIT, match.source, Matched.SEMANTIC)
        return hit_reply(ctx, entry, outcome, extra=extra), None
