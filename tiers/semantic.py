"""L2, the semantic tier: reuse an LLM response for a differently worded but equivalent question.

A match needs all of:

1. the same tenant, namespace and :class:`~normalizer.signature.ContextSignature` digest (model, system
   prompt, tools, sampling class, earlier turns, whether documents are carried, knowledge version...). Each such
   triple is one partition of the vector store, so a search never even sees another context's questions;
2. cosine similarity of the final user questions' embeddings ≥ the namespace's threshold: by default the lowest one
   whose wrong share of served hits is, with 95% confidence, within ``max_wrong_hit_rate`` (:mod:`tiers.calibration`,
   docs/semantic.md), learned from comparisons of cached and fresh answers; or a fixed one set by the operator;
3. no guard veto (:func:`normalizer.guards.veto`: numbers, dates, negations, quoted strings... that differ), and no
   line one question carries that the comparison did not weigh (:func:`tiers.question_lines.compare_lines`: the
   compared questions leave out template lines, but never a line where the two differ);
4. the new prompt still carries the documents the cached answer rests on, and adds none that holds its content
   (:func:`normalizer.evidence.unsupported`: the documents it cites in any form or whose distinctive content it
   uses; the same texts).

The tier stores no response bytes. Each vector's id is the **entry key** (the L1 key under which the
response is kept in a :class:`~tiers.storage.KeyValueStore`), and its payload holds the original question
text so that guards can compare it with the new one::

    partition  "<tenant>\\x1f<namespace>\\x1f<signature digest>"
               "<tenant>\\x1f<namespace>~<user digest>\\x1f<signature digest>"   (user-scoped: private namespaces)
    id         entry key (L1 key of the response)
    payload    {"question": <final user question as compared>, "asked": <as asked, when template lines were left out>}

What an answer rests on (:func:`normalizer.evidence.evidence`) is kept once, in its entry's meta, where the answer is
(L1, L3): it is counted in that tier's bytes and goes with the entry. When the new prompt carries documents, the
candidates' evidence is read from their entries (``evidence``, an :data:`EvidenceReader`) before choosing; a
candidate whose answer is gone is dropped from the index then. The index itself keeps within ``cache.l2.max_bytes``
(:class:`~tiers.vectors.hnsw.HnswVectorStore`: partitions cost what they hold and are evicted whole, the heaviest
tenant's least recently used first, :func:`partition_owner`), and so do the templates and the calibration evidence
(:meth:`SemanticTier.memory`).

Up to ``candidates`` nearest questions above the threshold are examined, most similar first; the first that
no guard vetoes and whose documents the new prompt carries is the match (a vetoed nearest neighbour must not hide
an equivalent one just behind it). The same rule picks the candidate compared for calibration, so the threshold's
bound covers the decision served, documents included.
Choosing is a pure function, :func:`choose_match`; :class:`SemanticTier` is the thin async part around it.

One decision for every source of candidates: :meth:`SemanticTier.decide` searches this tier's index and, when its
own candidates cannot serve, a second source (``more``: the cold tier's stored question vectors), then chooses once
among both, under one threshold, with one verification draw and one hit counter. A would-be hit drawn for
verification is forwarded whatever source it came from.
Defaults (error bound, guards) come from ``python -m loadtest.bench fidelity`` on real question pairs; see
:data:`DEFAULT_MAX_WRONG_HIT_RATE` and :data:`DEFAULT_GUARDS`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from normalizer.canonical_json import JSONValue
from normalizer.documents import Document
from normalizer.evidence import Carried, unsupported, without_citations
from normalizer.guards import veto as guard_veto
from tiers.answer_check import AnswerAgreement, uninformative
from tiers.background import stop_task
from tiers.budgets import Accounted, MemoryAccount
from tiers.calibration import DEFAULT_MAX_BYTES as DEFAULT_CALIBRATION_BYTES
from tiers.calibration import GRID, Calibrator
from tiers.calibration_progress import ProgressBoard
from tiers.embedders.base import Embedder, FloatArray
from tiers.latency import LatencyHistogram
from tiers.question_lines import LineDiff, diff_lines, lines_similarity
from tiers.question_templates import DEFAULT_MAX_BYTES as DEFAULT_TEMPLATES_BYTES
from tiers.question_templates import QuestionTemplates
from tiers.repeated_answers import DEFAULT_MAX_BYTES as DEFAULT_REPLIES_BYTES
from tiers.repeated_answers import RepeatedAnswers
from tiers.vectors.base import VectorHit, VectorStore

log = logging.getLogger(__name__)

MAX_COMPARISONS = 4
"""Answer comparisons running at once (each reads the cached answer from a tier); more are dropped and counted:
calibration evidence may wait, a lookup should not."""

MAX_UNJUDGED = 64
"""Comparisons held while the answer check has seen too few answers to judge (:attr:`AnswerAgreement.ready`); they
are judged once it has (the oldest dropped beyond): a new namespace's first pairs are evidence too."""

Veto = Callable[[str, str, Iterable[str]], "str | None"]
CandidateSource = Callable[[FloatArray], Awaitable[list[VectorHit]]]
"""More candidates for a question's embedding, beyond this tier's index (the cold tier's question vectors); each
hit's payload holds ``question``, ``source`` (the tier that keeps its answer) and ``evidence``."""
EvidenceReader = Callable[[Sequence[VectorHit]], Awaitable[list[VectorHit]]]
"""This index's candidates with ``evidence`` added to each payload, read from the entry of its answer; a candidate
whose answer is gone is left out."""

DEFAULT_GUARDS: tuple[str, ...] = ("numbers", "dates", "negations", "entities", "order")
"""Guards on by default: ``numbers``, ``dates`` and ``entities`` lowered the wrong-hit share at equal recall on real
question pairs in exploratory runs (calibration half of Quora Question Pairs; BENCHMARKS.md, "L2 on real question
pairs"); ``negations`` is kept because a negated question is never the same question, ``order`` because a reversed
role or direction is not (its cost in recall: BENCHMARKS.md). The others stay available;
``ragproxy calibrate --half calibration --curve --config C`` shows a guard set's curve."""

DEFAULT_MAX_WRONG_HIT_RATE = 0.05
DEFAULT_ANSWER_AGREEMENT = 0.4
"""Similarity of two answers from which they agree (``cache.l2.answer_agreement``)."""
DEFAULT_CANDIDATES = 4
"""Nearest questions examined per lookup (``cache.l2.candidates``)."""

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
    """A cached answer for an equivalent question: its entry key, similarity, original question, and the source
    that found it (``l2``: this tier's index; else the tier named in the candidate's payload)."""

    key: str
    similarity: float
    question: str
    source: str = "l2"
    evidence: JSONValue = None
    """What its answer rests on (:func:`normalizer.evidence.evidence`), when asked with documents."""
    asked: str = ""
    """Its question as asked, when the comparison left template lines out of ``question``."""


@dataclass(frozen=True, slots=True)
class SemanticDecision:
    """``match``: serve its answer; ``probe``: forward, then compare the fresh answer with this candidate's (a
    would-be hit picked for verification, or the best candidate below the threshold); ``vector``: the question's
    embedding when one was computed (the cold tier keeps it with the answer)."""

    match: SemanticMatch | None = None
    probe: SemanticMatch | None = None
    vector: FloatArray | None = None


@dataclass(slots=True)
class SemanticStats:
    """Counters for metrics: lookups, hits, misses below threshold, vetoes by guard, hits forwarded to verify them,
    answer comparisons and how many disagreed."""

    lookups: int = 0
    hits: int = 0
    """Semantic hits served, whichever source held the answer (the one counter of them)."""
    below_threshold: int = 0
    errors: int = 0
    """Lookups that failed (model or vector store down): the request went on as a miss."""
    vetoes: dict[str, int] = field(default_factory=dict)
    lookup_seconds: LatencyHistogram = field(default_factory=LatencyHistogram)
    """How long each lookup took, the embedding included."""
    verified: int = 0
    compared: int = 0
    disagreed: int = 0
    unjudged: int = 0
    """Comparisons made before the answer check had seen enough answers to judge: held and judged once it has
    (:data:`MAX_UNJUDGED`)."""
    unjudged_dropped: int = 0
    """Of those, the oldest dropped unjudged because :data:`MAX_UNJUDGED` were already held: evidence lost."""
    uninformative: int = 0
    """Agreements not counted as evidence: answers their requests dictated (:func:`uninformative`), or given word for
    word to several questions (:class:`~tiers.repeated_answers.RepeatedAnswers`)."""
    comparisons_dropped: int = 0
    """Comparisons skipped because :data:`MAX_COMPARISONS` were running."""
    index_errors: int = 0
    """Questions that could not be added to the index, and failed cold-tier vector lookups (not lookups)."""


def answer_text(body: bytes) -> str | None:
    """The assistant's text in a complete answer: a chat completion's ``choices[0].message.content``, or a
    Responses API object's ``output_text`` parts; else ``None``."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    choices, output = payload.get("choices"), payload.get("output")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else None
    if isinstance(output, list):
        texts = [part["text"] for item in output if isinstance(item, dict) and item.get("type") == "message"
                 for part in item.get("content") or () if isinstance(part, dict)
                 and part.get("type") == "output_text" and isinstance(part.get("text"), str)]
        return "".join(texts) or None
    return None


def edit_answer_text(body: bytes, edit: Callable[[str], str]) -> bytes:
    """``body`` (a complete answer, as :func:`answer_text` reads it) with ``edit`` applied to each text the assistant
    wrote: every chat choice's ``message.content``, every ``output_text`` part of a Responses object; the same bytes
    when nothing changed."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict):
        return body
    texts: list[tuple[dict[str, Any], str]] = []
    for choice in payload.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            texts.append((message, "content"))
    for item in payload.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            texts.extend((part, "text") for part in item.get("content") or ()
                         if isinstance(part, dict) and part.get("type") == "output_text"
                         and isinstance(part.get("text"), str))
    changed = False
    for holder, name in texts:
        edited = edit(holder[name])
        changed |= edited != holder[name]
        holder[name] = edited
    return orjson.dumps(payload) if changed else body


def partition_of(scope: SemanticScope, signature_digest: str) -> str:
    """The vector-store partition of a tenant, namespace (and user, :attr:`SemanticScope.label`) and context
    signature."""
    return _SEPARATOR.join((scope.tenant, scope.label, signature_digest))


def partition_owner(partition: str) -> str:
    """The tenant a partition belongs to (whose partitions leave first when it holds the most)."""
    return partition.split(_SEPARATOR, 1)[0]


def templates_key(scope: SemanticScope) -> str:
    """Where :class:`~tiers.question_templates.QuestionTemplates` learns a scope's template: per tenant and namespace
    (and user), owned by the tenant."""
    return f"{scope.tenant}{_SEPARATOR}{scope.label}"


def asked_payload(question: str, asked: str | None) -> dict[str, str]:
    """A question's record: ``question`` as compared, and ``asked`` only when the comparison left lines out of it."""
    return {"question": question, **({"asked": asked} if asked is not None and asked != question else {})}


def choose_match(
    question: str,
    candidates: Sequence[VectorHit],
    threshold: float,
    guards: Iterable[str],
    veto: Veto = guard_veto,
    on_veto: Callable[[str], None] | None = None,
    documents: Sequence[Document] | Carried = (),
    asked: str | None = None,
    line_vectors: Mapping[str, FloatArray] | None = None,
) -> SemanticMatch | None:
    """The most similar candidate at or above ``threshold`` whose lines differ from ``asked``'s only in what was
    weighed (:mod:`tiers.question_lines`; its similarity is then the least of its question's and its differing
    lines', embedded in ``line_vectors``: :func:`lines_to_weigh`), that no enabled guard vetoes and whose answer's
    evidence a prompt carrying ``documents`` supports, else ``None``; ``question``: ``asked`` as compared (its
    template lines left out), ``asked`` defaulting to it.

    ``on_veto`` is called with each veto reason (for metrics; ``lines`` when a differing line tells them apart,
    ``documents`` when what the answer rests on is not carried, ``added_document`` when a document it was not given
    holds its content: :func:`normalizer.evidence.unsupported`).
    """
    enabled = tuple(guards)
    carried = documents if isinstance(documents, Carried) else Carried(documents)
    weighed: list[tuple[float, VectorHit, LineDiff]] = []
    for hit in candidates:
        if hit.similarity < threshold:
            continue
        diff = _diff(question, asked, hit)
        similarity = hit.similarity
        if diff.veto is None:
            lines = lines_similarity(diff.weigh, line_vectors or {})
            if lines is None or lines < threshold:
                diff = LineDiff("lines: a differing line is not alike" if lines is not None
                                else "lines: not weighed", diff.texts)
            else:
                similarity = min(similarity, lines)
        weighed.append((similarity, hit, diff))
    for similarity, hit, diff in sorted(weighed, key=lambda w: w[0], reverse=True):
        reason = diff.veto
        if reason is None and enabled:
            reason = veto(*diff.texts, enabled)
        if reason is None:
            reason = unsupported(hit.payload.get("evidence"), carried)
        if reason is None:
            return SemanticMatch(hit.id, similarity, str(hit.payload.get("question", "")),
                                 str(hit.payload.get("source", "l2")), hit.payload.get("evidence"),
                                 str(hit.payload.get("asked") or ""))
        if on_veto is not None:
            on_veto(reason)
    return None


def _diff(question: str, asked: str | None, hit: VectorHit) -> LineDiff:
    original = str(hit.payload.get("question", ""))
    return diff_lines(asked or question, question, str(hit.payload.get("asked") or original), original)


def lines_to_weigh(question: str, candidates: Sequence[VectorHit], threshold: float,
                   asked: str | None = None) -> list[str]:
    """The differing lines :func:`choose_match` weighs by their own embeddings for these candidates."""
    lines: dict[str, None] = {}
    for hit in candidates:
        if hit.similarity >= threshold and (diff := _diff(question, asked, hit)).veto is None:
            lines.update(dict.fromkeys((*diff.weigh[0], *diff.weigh[1])))
    return list(lines)


class SemanticTier:
    """Finds and records equivalent questions; response bytes live elsewhere under the entry key."""

    def __init__(
        self,
        embedder: Embedder,
        store: VectorStore,
        *,
        threshold: float | None = None,
        namespace_thresholds: Mapping[str, float] | None = None,
        max_wrong_hit_rate: float = DEFAULT_MAX_WRONG_HIT_RATE,
        verify_fraction: float = 0.0,
        answer_agreement: float = DEFAULT_ANSWER_AGREEMENT,
        guards: Iterable[str] = DEFAULT_GUARDS,
        candidates: int = DEFAULT_CANDIDATES,
        veto: Veto = guard_veto,
        calibration_max_bytes: int = DEFAULT_CALIBRATION_BYTES,
        templates_max_bytes: int = DEFAULT_TEMPLATES_BYTES,
        replies_max_bytes: int = DEFAULT_REPLIES_BYTES,
    ) -> None:
        """``threshold``/``namespace_thresholds``: fixed cosine thresholds (overrides of the calibrated ones);
        ``max_wrong_hit_rate``: the error bound calibrated thresholds meet (:mod:`tiers.calibration`);
        ``verify_fraction``: share of would-be hits forwarded to check them; ``answer_agreement``: the similarity of
        two answers (:class:`~tiers.answer_check.AnswerAgreement`) from which they agree; ``guards``: names of the
        enabled guards
        (see :mod:`normalizer.guards`); ``candidates``: neighbours examined per lookup; ``veto``: the guard function
        (injectable for experiments); ``calibration_max_bytes``/``templates_max_bytes``/``replies_max_bytes``: the
        budgets of the calibration evidence, the question templates and the answers given to several questions."""
        if embedder.dim != store.dim:
            raise ValueError(f"embedder dim {embedder.dim} != vector store dim {store.dim}")
        self.embedder = embedder
        self.store = store
        self.calibrator = Calibrator(max_wrong_hit_rate, fixed=threshold,
                                     namespace_fixed=dict(namespace_thresholds or {}), verify_fraction=verify_fraction,
                                     max_bytes=calibration_max_bytes)
        self.templates = QuestionTemplates(templates_max_bytes)
        self.replies = RepeatedAnswers(replies_max_bytes)
        self.progress = ProgressBoard(self.calibrator)
        """How far each namespace's calibration has come (``/admin/stats``, the logs, the start-up summary)."""
        self.answers = AnswerAgreement(answer_agreement)
        self.guards = tuple(guards)
        veto("", "", self.guards)  # unknown guard names fail here, at start-up
        self.candidates = max(1, candidates)
        self.veto = veto
        self.stats = SemanticStats()
        self._comparing: set[asyncio.Task[None]] = set()
        self._unjudged: deque[tuple[SemanticScope, SemanticMatch, str, str, str, tuple[str, ...]]] = \
            deque(maxlen=MAX_UNJUDGED)
        """Comparisons waiting for the answer check to be ready: (scope, probe, cached, fresh, question, prompt)."""

    def memory(self) -> list[MemoryAccount]:
        """The ledger's lines of the index (an embedded one), the question templates, the calibration evidence and the
        answers given to several questions."""
        index = self.store.memory() if isinstance(self.store, Accounted) else []
        return [*index, *self.templates.memory(), *self.calibrator.memory(), *self.replies.memory()]

    def question(self, scope: SemanticScope, text: str) -> str:
        """The question compared: ``text`` without the lines the scope's template repeats
        (:class:`~tiers.question_templates.QuestionTemplates`)."""
        return self.templates.question(templates_key(scope), text)

    def threshold_for(self, scope: SemanticScope) -> float:
        """The cosine threshold ``scope``'s namespace runs at now, for its tenant."""
        return self.calibrator.threshold(scope.namespace, scope.tenant)

    async def lookup(self, scope: SemanticScope, signature_digest: str, question: str,
                     asked: str | None = None) -> SemanticMatch | None:
        """An equivalent cached question under the same context, or ``None``."""
        return (await self.decide(scope, signature_digest, question, asked=asked)).match

    async def decide(self, scope: SemanticScope, signature_digest: str, question: str,
                     more: CandidateSource | None = None, documents: Sequence[Document] = (),
                     evidence: EvidenceReader | None = None, asked: str | None = None) -> SemanticDecision:
        """Serve a match, or forward (and maybe compare answers with a probe afterwards); ``question``: as compared
        (:meth:`question`), ``asked``: as asked when that differs; ``more``: a second source
        of candidates, searched when this tier's own cannot serve; ``documents``: those the new prompt carries;
        ``evidence``: how this index's candidates' evidence is read (with ``documents`` and without it, this index's
        candidates are not used: nothing says what their answers rest on)."""
        self.stats.lookups += 1
        started = time.perf_counter()
        try:
            return await self._decide(scope, signature_digest, question, more, documents, evidence, asked)
        except Exception:
            self.stats.errors += 1
            raise
        finally:
            self.stats.lookup_seconds.observe(time.perf_counter() - started)

    async def _decide(self, scope: SemanticScope, signature_digest: str, question: str,
                      more: CandidateSource | None, documents: Sequence[Document],
                      evidence: EvidenceReader | None, asked: str | None) -> SemanticDecision:
        partition = partition_of(scope, signature_digest)
        indexed = await self.store.count(partition) > 0
        if not indexed and more is None:
            return SemanticDecision()
        [vector] = await self.embedder.embed([question])
        hits = await self.store.search(partition, vector, k=self.candidates) if indexed else []
        threshold = self.threshold_for(scope)
        floor = min(threshold, GRID[0])
        carried = Carried(documents)
        if hits and documents:  # what the answers rest on is in their entries: unread, they cannot serve
            hits = await evidence([hit for hit in hits if hit.similarity >= floor]) if evidence is not None else []
        best = choose_match(question, hits, floor, self.guards, self.veto, self._count_veto, carried, asked,
                            await self._line_vectors(question, hits, floor, asked))
        if (best is None or best.similarity < threshold) and more is not None:
            known = {hit.id for hit in hits}  # an answer both know is this index's (its own float32 score)
            extra = [hit for hit in await more(vector) if hit.id not in known]
            other = choose_match(question, extra, floor, self.guards, self.veto, self._count_veto, carried, asked,
                                 await self._line_vectors(question, extra, floor, asked))
            if other is not None and (best is None or other.similarity > best.similarity):
                best = other
        if best is None:
            self.stats.below_threshold += 1
            return SemanticDecision(vector=vector)
        self.calibrator.look(scope.namespace, best.similarity, scope.tenant)
        if best.similarity < threshold:
            self.stats.below_threshold += 1
            return SemanticDecision(probe=best, vector=vector)
        if self.calibrator.should_verify(scope.namespace, scope.tenant):
            self.stats.verified += 1
            return SemanticDecision(probe=best, vector=vector)
        return SemanticDecision(match=best, vector=vector)

    async def _line_vectors(self, question: str, hits: Sequence[VectorHit], floor: float,
                            asked: str | None) -> dict[str, FloatArray]:
        """The embeddings of the lines to weigh for ``hits`` (one batch; none asked for in the usual case)."""
        lines = lines_to_weigh(question, hits, floor, asked)
        return dict(zip(lines, await self.embedder.embed(lines), strict=True)) if lines else {}

    def served(self) -> None:
        """Count one semantic hit served (from whichever tier held the matched answer)."""
        self.stats.hits += 1

    def learn_answer(self, answer: str, scope: SemanticScope | None = None, question: str = "") -> None:
        """An answer the upstream gave (word weights of the answer check; with ``scope``, the answers given to
        several questions, :class:`~tiers.repeated_answers.RepeatedAnswers`); once the check is ready, the
        comparisons held until then are judged."""
        answer = without_citations(answer)
        self.answers.learn(answer)
        if scope is not None:
            self.replies.learn(templates_key(scope), question, answer)
        if self._unjudged and self.answers.ready:
            while self._unjudged:
                self._judge(*self._unjudged.popleft())

    def compare(self, scope: SemanticScope, probe: SemanticMatch, cached_answer: str, fresh_answer: str,
                question: str = "", prompt: Sequence[str] = ()) -> bool | None:
        """Record whether the answer cached for ``probe`` agrees with the fresh answer to ``question`` (as asked;
        ``prompt``: what else the request told the model, its system prompt and earlier turns)
        (:class:`~tiers.answer_check.AnswerAgreement`); an agreement the request dictated, or of an answer given to
        several questions, is not evidence (:func:`~tiers.answer_check.uninformative`,
        :class:`~tiers.repeated_answers.RepeatedAnswers`). The verdict, or ``None`` while the check cannot judge yet
        (the comparison is then held, :data:`MAX_UNJUDGED`, and judged once it can)."""
        self.stats.compared += 1
        if not self.answers.ready:
            self.stats.unjudged += 1
            self.stats.unjudged_dropped += len(self._unjudged) == MAX_UNJUDGED
            self._unjudged.append((scope, probe, cached_answer, fresh_answer, question, tuple(prompt)))
            return None
        return self._judge(scope, probe, cached_answer, fresh_answer, question, tuple(prompt))

    def _judge(self, scope: SemanticScope, probe: SemanticMatch, cached_answer: str, fresh_answer: str,
               question: str, prompt: tuple[str, ...]) -> bool:
        cached_question = probe.asked or probe.question
        prompts = (cached_question, question, *prompt)
        cached_answer, fresh_answer = without_citations(cached_answer), without_citations(fresh_answer)
        namespace = templates_key(scope)
        self.replies.learn(namespace, cached_question, cached_answer)
        self.replies.learn(namespace, question, fresh_answer)
        agreed = self.answers.agree(cached_answer, fresh_answer, prompts)
        fixed = any(self.replies.repeated(namespace, answer) for answer in (cached_answer, fresh_answer))
        if agreed and (fixed or uninformative(cached_answer, fresh_answer, prompts)):
            self.stats.uninformative += 1
            return True
        self.stats.disagreed += not agreed
        self.calibrator.observe(scope.namespace, probe.similarity, agreed, scope.tenant)
        if (news := self.progress.news(scope.namespace, scope.tenant)) is not None:
            log.info("semantic calibration of %s/%s: %s", scope.tenant, scope.namespace, news)
        return agreed

    def compare_later(self, comparison: Callable[[], Coroutine[None, None, None]]) -> None:
        """Run ``comparison`` (which ends in :meth:`compare`) in the background, off the request's path; dropped
        when :data:`MAX_COMPARISONS` already run."""
        if len(self._comparing) >= MAX_COMPARISONS:
            self.stats.comparisons_dropped += 1
            return
        task = asyncio.create_task(self._logged(comparison()), name="semantic-compare")
        self._comparing.add(task)
        task.add_done_callback(self._comparing.discard)

    @staticmethod
    async def _logged(comparison: Coroutine[None, None, None]) -> None:
        try:
            await comparison
        except Exception as exc:  # fail open: evidence is an optimisation
            log.warning("semantic answer comparison failed: %s", exc)

    async def stop_comparisons(self) -> None:
        """Cancel the comparisons still running (at shutdown)."""
        for task in list(self._comparing):
            await stop_task(task)

    def _count_veto(self, reason: str) -> None:
        guard = reason.split(":", 1)[0]
        self.stats.vetoes[guard] = self.stats.vetoes.get(guard, 0) + 1

    async def add(self, scope: SemanticScope, signature_digest: str, question: str, entry_key: str,
                  asked: str | None = None) -> None:
        """Record that ``entry_key`` answers ``question`` (as compared; ``asked``: as asked, kept when it differs)
        under this scope and context (what the answer rests on is kept with the entry: module docstring)."""
        [vector] = await self.embedder.embed([question])
        await self.store.add(partition_of(scope, signature_digest), [entry_key], vector[None, :].astype(np.float32),
                             [asked_payload(question, asked)])

    async def delete(self, entry_keys: Sequence[str]) -> int:
        """Forget entries (their responses were evicted or invalidated); the number that existed."""
        return await self.store.delete(entry_keys)

    async def delete_context(self, scope: SemanticScope, signature_digest: str) -> int:
        """Forget every question recorded under one scope and context signature."""
        return await self.store.delete_partition(partition_of(scope, signature_digest))
