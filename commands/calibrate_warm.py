"""``ragproxy calibrate --warm LOG.jsonl``: a namespace's calibration started from an app's own logged questions and
answers, before its traffic reaches the proxy.

Each line of the log is one question the app asked and the answer its backend gave: ``{"question": str, "answer":
str, "namespace"?: str, "system"?: str}`` (``namespace``: default ``--namespace``; ``system``: the system prompt it
was asked under: questions are compared only with questions asked under the same one, as the proxy compares only
within one context). The log is replayed in order through the semantic tier the proxy would run (the configured
embedder, guards, candidates and answer check): each question looks up the earlier ones of its namespace; when its
best candidate scores at least the grid's floor, the answer logged for that candidate (the cached answer) is compared
with the answer logged for this question (the fresh one), exactly as a live near miss or a verified hit is, and the
verdict is one comparison of the namespace's evidence. Only these real pairs of answers count: nothing is labelled
or assumed. The evidence is written to ``calibration-warm.json`` in the data directory (:mod:`tiers.calibration_file`),
which ``ragproxy serve`` reads at start (docs/semantic.md: why the bound still holds). The proxy's own cache trace
(``cache.trace_file``) records keys and sizes, no answers, so it cannot warm a namespace.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.answers.settings import L2Settings
from tiers.calibration import Evidence
from tiers.calibration_progress import Progress
from tiers.embedders import Embedder
from tiers.semantic import SemanticScope, SemanticTier
from tiers.vectors.hnsw import HnswVectorStore

MAX_LINE_BYTES = 1 << 20
"""A log line longer than this is refused (a question and its answer, not a document dump)."""


class LogError(ValueError):
    """A log line the warm-up cannot read (its message names the line)."""


@dataclass(frozen=True, slots=True)
class Logged:
    """One logged question and the answer it got."""

    question: str
    answer: str
    namespace: str
    system: str = ""


@dataclass(frozen=True, slots=True)
class Warmed:
    """One namespace's evidence from a log, and where it leaves the namespace."""

    tenant: str
    namespace: str
    evidence: Evidence
    progress: Progress
    unjudged: int
    """Comparisons the answer check could not judge (too few answers to learn its word weights from)."""


def read_log(path: Path, namespace: str = "default") -> list[Logged]:
    """The records of a JSONL log; :class:`LogError` naming the first line that is not one."""
    records = []
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if len(line) > MAX_LINE_BYTES:
                raise LogError(f"{path}:{number}: longer than {MAX_LINE_BYTES} bytes")
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise LogError(f"{path}:{number}: not JSON ({exc})") from None
            question, answer = (row.get("question"), row.get("answer")) if isinstance(row, dict) else (None, None)
            if not (isinstance(question, str) and question and isinstance(answer, str) and answer):
                raise LogError(f'{path}:{number}: expected {{"question": str, "answer": str, "namespace"?: str, '
                               '"system"?: str}')
            space, system = row.get("namespace", namespace), row.get("system", "")
            if not (isinstance(space, str) and isinstance(system, str)):
                raise LogError(f"{path}:{number}: namespace and system must be strings")
            records.append(Logged(question, answer, space, system))
    return records


async def gather(records: Sequence[Logged], embedder: Embedder, settings: L2Settings,
                 tenant: str = "anonymous") -> list[Warmed]:
    """Replay ``records`` through a semantic tier built like the proxy's (on ``embedder``, calibrating: no fixed
    threshold) and return each namespace's evidence."""
    with tempfile.TemporaryDirectory(prefix="ragproxy-warm-") as scratch:
        store = HnswVectorStore(embedder.dim, Path(scratch))
        tier = SemanticTier(embedder, store, max_wrong_hit_rate=settings.max_wrong_hit_rate,
                            answer_agreement=settings.answer_agreement, guards=settings.guards,
                            candidates=settings.candidates)
        answers: dict[str, str] = {}
        try:
            for index, record in enumerate(records):
                scope = SemanticScope(tenant, record.namespace)
                context = hashlib.blake2b(record.system.encode(), digest_size=8).hexdigest()
                tier.learn_answer(record.answer, scope, record.question)
                decision = await tier.decide(scope, context, record.question)
                best = decision.match or decision.probe
                if best is not None:
                    tier.compare(scope, best, answers[best.key], record.answer, record.question, (record.system,))
                key = str(index)
                answers[key] = record.answer
                await tier.add(scope, context, record.question, key)
        finally:
            await store.close()
        unjudged = tier.stats.unjudged - tier.stats.unjudged_dropped if not tier.answers.ready else 0
        warmed = []
        for namespace in dict.fromkeys(record.namespace for record in records):
            evidence = tier.calibrator.evidence_of(namespace, tenant) or Evidence()
            warmed.append(Warmed(tenant, namespace, evidence, tier.progress.of(namespace, tenant), unjudged))
        return warmed
