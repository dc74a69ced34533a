"""``python -m loadtest.bench fidelity --pairs PATH [--labels same_answer|is_duplicate] [--mode shared|pairwise|
population|variants] [--mix S] [--count N] [--answers fixed|varied] [--half H] [--seed N] [--quick] [--rag K]
[--rag-form structured|inline] [--rag-prompt pair|one] [--rag-cite FORM] [--rag-quote N] [--extra-labels PATH]
[--dump-cross PATH] [--json]``: L2 on real
labelled question pairs, through a real ``ragproxy serve`` at its defaults, as users meet it.

Input: a CSV of ``question1,question2,is_duplicate[,same_answer]`` (``../shared/data/qqp_dev_relabelled.csv``; read
from the path given, never shipped). ``--labels same_answer`` (the default) reads whether one answer serves both
questions from ``same_answer`` where it is given and from ``is_duplicate`` elsewhere (:func:`tiers.labelled_pairs.
read_pairs`). Clusters are the connected components of the pairs labelled 1 (:mod:`loadtest.fidelity_traffic`);
two questions need the same answer when they share a cluster. ``--half`` keeps one deterministic half
(:func:`tiers.labelled_pairs.half_of`; report ``held-out``, the default: the prior curve and the defaults were set on
``calibration``). ``--mix S`` draws ``--count`` pairs of which a share ``S`` need the same answer (else the first
``--count`` pairs of the half as they come).

The upstream is a test double speaking the OpenAI chat wire format (a child process): ``--answers fixed`` answers
every question of a cluster with one text (:func:`cluster_answer`); ``--answers varied`` words every answer anew
like a sampling LLM, the same points for one cluster and look-alike wording for look-alike questions
(:mod:`loadtest.sampled_answers`). The client tells which cluster a served answer came from by remembering every
answer the upstream gave; an answer of another cluster is a wrong hit. ``--extra-labels PATH`` adds labels
(``question1,question2,same_answer``) for pairs the file does not hold, such as two questions of different pairs
that meet in one context: 1 joins their clusters for the upstream's answers and for counting wrong hits
(:mod:`loadtest.cross_pairs`). ``--dump-cross PATH`` lists such pairs of a run for labelling: every hit across
clusters, and each question's nearest earlier question of another cluster by the bench's embedding.

Modes (the proxy starts empty for each):

- ``shared``: one namespace, each pair in its own context (system message ``"pair <i>"``), sent in order: the first
  question, then the second. What a new application meets: its first semantic hit comes at the pair reported.
- ``pairwise``: the same, in blocks of 64 (first questions, then second questions).
- ``population``: one context for all: every distinct first question, then every distinct second question not
  among them; each sees every cached question before it.
- ``variants``: trivial retypings (whitespace, trailing question marks, Unicode forms; ``trivial_variants``)
  of ``--count`` first questions in one context: each question, then three of its variants. Counts the variants
  served as exact ``HIT`` from the first repeat, and wrong answers.

``--rag K`` (with ``--mode shared``): the RAG loop (:mod:`loadtest.rag_retrieval`). Every question is embedded,
searched through the proxy's own Qdrant route (the TEST-ONLY shim behind it holds ``--rag-corpus-size`` questions of
``--rag-corpus``, default the pairs file, that are not in the traffic), and asked under one system prompt with the
top-K it retrieved, in the order returned (each pair under its own system prompt as without ``--rag``, so the two
runs differ by the documents alone; ``--rag-prompt one``: all under one, as an app sends them, where every question
meets every other as in ``population``; without ``--rag``, the same shape without documents): as
``ragproxy.documents`` (``--rag-form structured``) or pasted into the user message as numbered sources (``--rag-form
inline``). The upstream cites the first document it was given (``[doc-N]``, or ``[1]`` inline; ``--rag-cite
position|id|source-id|title|none`` chooses another form, and
``--rag-quote N`` makes its answer quote the first N words of that document), so a hit whose answer names (by id or
title) a document the new request does not carry is counted (``miscited_hits``; positions are not judged, see
:class:`RagLoop`); the report adds the shares of pairs
whose two questions retrieved identical documents (in order, and as sets) and how many searches the proxy's search
cache answered. Run the same arguments without ``--rag`` for the same pairs with one context each.

Figures, over second questions: **recall** = second questions of same-answer pairs answered with their cluster's
answer / all such; **wrong-hit share** = answers of another cluster / hits; the **hindsight oracle**: the best fixed
threshold of the grid on the same run's pairs (the proxy's own embedder and guards, everything else ideal), its
recall at the bound (``cache.l2.max_wrong_hit_rate``), and ``recall / oracle recall``; the pair at which the first
semantic hit came; semantic-hit p50/p99 (HTTP round trip, embedding included) against the exact-hit p50 of the same
run; with varied answers, how often the proxy's answer check (:class:`tiers.answer_check.AnswerAgreement`, run here
on the run's own answers) agreed on same-answer and on other pairs. ``--quick``: 300 pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web

from loadtest.cross_pairs import NEAR, ExtraUse, nearest_cross, read_extra, with_extra, write_cross
from loadtest.fidelity_traffic import (
    best_at,
    clusters,
    oracle_curve,
    oracle_population_curve,
    population_order,
    same,
    sample_mix,
    trivial_variants,
)
from loadtest.harness import child, free_port, percentiles, proxy_process
from loadtest.rag_retrieval import (
    BY_ID,
    CITES,
    FORMS,
    Retriever,
    asked,
    corpus,
    first_source,
    first_words,
    inline_message,
    load,
)
from loadtest.sampled_answers import SampledAnswers
from normalizer.evidence import without_citations
from normalizer.guards import veto
from proxy.answers.settings import L2Settings
from tiers.answer_check import AnswerAgreement
from tiers.labelled_pairs import HALVES, LABELS, LabelledPair, half_of, read_pairs

BLOCK = 64
RAG_SYSTEM = "Answer from the documents; cite the one you used."
_WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kelp",
          "lumen", "meadow", "nectar", "onyx", "prairie", "quartz", "russet", "sierra", "tundra", "umber", "velvet",
          "willow", "xenon", "yarrow", "zephyr")


def cluster_answer(cluster: int) -> str:
    """The fixed answer of one cluster: 24 pseudo-random words seeded by its number."""
    rng = random.Random(cluster)
    return f"Answer {cluster}: " + " ".join(rng.choice(_WORDS) for _ in range(24))


class ClusterAnswerUpstream:
    """Test double of an OpenAI-compatible backend: answers a question with its cluster's text, the same every time
    (``varied`` unset) or worded anew every time (:class:`~loadtest.sampled_answers.SampledAnswers`); given
    documents, it quotes the first ``quote`` words of the first one and cites it as ``cite`` says
    (:func:`~loadtest.rag_retrieval.first_source`)."""

    def __init__(self, by_question: dict[str, int], varied: SampledAnswers | None = None, cite: str = "auto",
                 quote: int = 0) -> None:
        self.by_question = by_question
        self.varied = varied
        self.cite = cite
        self.quote = quote

    def answer(self, question: str) -> str:
        cluster = self.by_question.get(question)
        if cluster is None:  # an unknown question (a retyped one the proxy forwarded) gets an answer of its own
            cluster = -1 - zlib.crc32(question.encode())
        return cluster_answer(cluster) if self.varied is None else self.varied.answer(question, cluster)

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            user = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
            system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
            source = first_source(system, user, self.cite)  # a RAG answer cites its first source
            quoted = first_words(system, user, self.quote)
            answer = self.answer(asked(user)) + (f' As one source puts it: "{quoted}".' if quoted else "") \
                + (f" {source}" if source else "")
            return web.json_response({
                "id": "chatcmpl-fidelity", "object": "chat.completion", "created": 1700000000,
                "model": body.get("model", "fidelity"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


def _uncited(answer: str) -> str:
    """An answer of the bench's upstream without its trailing citation (which a hit may have had renumbered)."""
    return re.sub(r' (?:\[[^\[\]]+\]|\(from "[^"]*"\))$', "", answer)


_NAMED = re.compile(r'\[(?:source: )?(doc-\d+)\]$|\(from "Knowledge base entry (\d+)"\)$')
"""The document a bench answer names at its end, by id (``[doc-N]``, ``[source: doc-N]``) or by title."""


@dataclass(slots=True)
class RagLoop:
    """The RAG loop: how questions retrieve and send documents, and what its hits cite."""

    retriever: Retriever
    form: str
    identical_documents: int = 0
    same_document_set: int = 0
    miscited: int = 0
    """Semantic hits whose served answer names a document (by id or title) the new request does not carry. A
    citation by position is not judged: with documents reordered for KV reuse (the default), the model's ``[1]`` is
    the first document the proxy sent, which the client does not see; an answer served without its citation (taken
    out, the new request lacking the document) or citing nothing is not counted."""

    def judge(self, text: str, status: str, first: list[dict[str, str]], second: list[dict[str, str]]) -> None:
        self.identical_documents += first == second
        self.same_document_set += {d["id"] for d in first} == {d["id"] for d in second}
        named = _NAMED.search(text)
        if status == "SEMANTIC_HIT" and named is not None:
            self.miscited += (named.group(1) or f"doc-{named.group(2)}") not in {d["id"] for d in second}


@dataclass(slots=True)
class Tally:
    """Outcomes of second questions (and of variants), and every answer seen with the cluster it answers."""

    by_question: dict[str, int]
    origin: dict[str, int] = field(default_factory=dict)
    asked_by: dict[str, str] = field(default_factory=dict)
    """Answer text (without a trailing citation) → the question the upstream gave it for."""
    order: list[str] = field(default_factory=list)
    """Every question asked, in order."""
    served_across: list[tuple[str, str]] = field(default_factory=list)
    """(question whose answer was served, question it was served for) of each hit across clusters."""
    """Answer text (without a trailing citation: a hit may be renumbered) → cluster of the question the upstream gave
    it for."""
    answers: list[str] = field(default_factory=list)
    """Every answer the upstream gave, in order."""
    wanted: int = 0
    recalled: int = 0
    hits: int = 0
    exact_hits: int = 0
    wrong: int = 0
    wrong_semantic: int = 0
    """Of the wrong hits, the semantic ones (the rest: exact repeats of a question the labels put in two clusters)."""
    first_repeats: int = 0
    first_repeat_hits: int = 0
    """Variants: questions retyped, and those whose first retyping was an exact ``HIT``."""
    first_hit: int | None = None
    """The 1-based pair (variants: question) at which the first semantic hit came."""
    hit_s: list[float] = field(default_factory=list)
    exact_s: list[float] = field(default_factory=list)
    compared: list[tuple[str, str, str, str, bool]] = field(default_factory=list)
    """(cached answer, fresh answer, cached question, new question, one answer serves both) of each miss whose
    context held a cached answer: what the proxy's answer check compared."""

    rag: RagLoop | None = None
    """The RAG loop's retrieval and figures (``None``: questions carry no documents)."""
    one_prompt: bool = False
    """``shared``: all pairs under one system prompt (an app's shape: every question can meet every other), else
    each pair under its own."""

    def record(self, question: str, text: str, status: str, documents: list[dict[str, str]] | None = None) -> None:
        self.order.append(question)
        if status in ("HIT", "SEMANTIC_HIT"):
            source = self.asked_by.get(_uncited(text))
            if source is not None and self.by_question.get(source) != self.by_question[question]:
                self.served_across.append((source, question))
        else:
            self.origin.setdefault(_uncited(text), self.by_question[question])
            self.asked_by.setdefault(_uncited(text), question)
            self.answers.append(text)

    def judge(self, question: str, text: str, status: str, elapsed: float, wanted: bool, at: int) -> None:
        hit = status in ("HIT", "SEMANTIC_HIT")
        right = self.origin.get(_uncited(text)) == self.by_question[question]
        self.wanted += wanted
        self.hits += hit
        self.exact_hits += status == "HIT"
        self.wrong += hit and not right
        self.wrong_semantic += status == "SEMANTIC_HIT" and not right
        self.recalled += wanted and hit and right
        if status == "SEMANTIC_HIT":
            self.hit_s.append(elapsed)
            if self.first_hit is None:
                self.first_hit = at

    @property
    def recall(self) -> float:
        return self.recalled / self.wanted if self.wanted else 0.0

    @property
    def wrong_share(self) -> float:
        return self.wrong / self.hits if self.hits else 0.0


def _body(question: str, context: str | None, documents: list[dict[str, str]] | None = None,
          form: str = "structured") -> bytes:
    user = inline_message(question, documents) if documents is not None and form == "inline" else question
    messages = ([{"role": "system", "content": context}] if context else []) + [{"role": "user", "content": user}]
    body: dict[str, Any] = {"model": "fidelity", "messages": messages}
    if documents is not None and form == "structured":
        body["ragproxy"] = {"documents": documents}
    return orjson.dumps(body)


async def _ask(session: aiohttp.ClientSession, url: str, question: str, context: str | None,
               documents: list[dict[str, str]] | None = None, form: str = "structured") -> tuple[str, str, float]:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=_body(question, context, documents, form),
                            headers={"Content-Type": "application/json"}) as response:
        payload = await response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"proxy answered {response.status}: {payload[:200]!r}")
        text = orjson.loads(payload)["choices"][0]["message"]["content"]
        return response.headers.get("X-Cache-Status", ""), text, elapsed


async def _pair(session: aiohttp.ClientSession, url: str, tally: Tally, index: int, pair: LabelledPair,
                first: tuple[str, str, float] | None = None) -> None:
    rag = tally.rag
    context = RAG_SYSTEM if tally.one_prompt else f"pair {index}"
    form = rag.form if rag else "structured"
    docs1 = await rag.retriever.top_k(session, pair.question1) if rag else None
    status, cached, _ = first or await _ask(session, url, pair.question1, context, docs1, form)
    tally.record(pair.question1, cached, status, docs1)
    if first is None:
        await asyncio.sleep(0.01)  # the index learns a question just after its answer was sent
    docs2 = await rag.retriever.top_k(session, pair.question2) if rag else None
    status, text, elapsed = await _ask(session, url, pair.question2, context, docs2, form)
    tally.record(pair.question2, text, status, docs2)
    tally.judge(pair.question2, text, status, elapsed, same(pair, tally.by_question), index + 1)
    if rag is not None and docs1 is not None and docs2 is not None:
        rag.judge(text, status, docs1, docs2)
    if status == "MISS":
        tally.compared.append((cached, text, pair.question1, pair.question2, same(pair, tally.by_question)))


async def _exact(session: aiohttp.ClientSession, url: str, tally: Tally, question: str, context: str | None) -> None:
    rag = tally.rag
    documents = await rag.retriever.top_k(session, question) if rag else None
    system = RAG_SYSTEM if tally.one_prompt else context
    status, _, elapsed = await _ask(session, url, question, system, documents, rag.form if rag else "structured")
    if status == "HIT":
        tally.exact_s.append(elapsed)


async def run_shared(url: str, pairs: Sequence[LabelledPair], tally: Tally) -> None:
    async with aiohttp.ClientSession() as session:
        for i, pair in enumerate(pairs):
            await _pair(session, url, tally, i, pair)
            if i % 8 == 0:
                await _exact(session, url, tally, pair.question1, f"pair {i}")


async def run_pairwise(url: str, pairs: Sequence[LabelledPair], tally: Tally) -> None:
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(pairs), BLOCK):
            block = list(enumerate(pairs[start:start + BLOCK], start))
            firsts = [await _ask(session, url, pair.question1, f"pair {i}") for i, pair in block]
            await asyncio.sleep(0.05)
            for (i, pair), first in zip(block, firsts, strict=True):
                await _pair(session, url, tally, i, pair, first)
            for i, pair in block[:4]:
                await _exact(session, url, tally, pair.question1, f"pair {i}")


async def run_population(url: str, pairs: Sequence[LabelledPair], tally: Tally) -> None:
    firsts, seconds = population_order(pairs)
    has_twin = {q for q in seconds if any(tally.by_question[q] == tally.by_question[r] for r in firsts)}
    async with aiohttp.ClientSession() as session:
        for question in firsts:
            status, text, _ = await _ask(session, url, question, None)
            tally.record(question, text, status)
        await asyncio.sleep(0.2)
        for at, question in enumerate(seconds, len(firsts) + 1):
            status, text, elapsed = await _ask(session, url, question, None)
            tally.record(question, text, status)
            tally.judge(question, text, status, elapsed, question in has_twin, at)
        for question in firsts[:256]:
            await _exact(session, url, tally, question, None)


async def run_variants(url: str, pairs: Sequence[LabelledPair], tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    questions = list(dict.fromkeys(p.question1 for p in pairs))
    async with aiohttp.ClientSession() as session:
        for at, question in enumerate(questions, 1):
            status, text, _ = await _ask(session, url, question, "variants")
            tally.record(question, text, status)
            for n, variant in enumerate(trivial_variants(question, 3, rng)):
                tally.by_question.setdefault(variant, tally.by_question[question])
                status, text, elapsed = await _ask(session, url, variant, "variants")
                tally.record(variant, text, status)
                tally.judge(variant, text, status, elapsed, True, at)
                if status == "HIT":
                    tally.exact_s.append(elapsed)
                if n == 0:
                    tally.first_repeats += 1
                    tally.first_repeat_hits += status == "HIT"


async def embed_all(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Each text's vector from the proxy's default local embedder."""
    from tiers.embedders import local_embedder

    embedder = local_embedder("auto", Path(tempfile.gettempdir()) / "ragproxy-fidelity-models")
    rows: dict[str, np.ndarray] = {}
    try:
        for start in range(0, len(texts), 64):
            chunk = list(texts[start:start + 64])
            rows.update(zip(chunk, await embedder.embed(chunk), strict=True))
    finally:
        await embedder.close()
    return rows


def answer_check_rates(tally: Tally, cut: float) -> dict[str, float | int | None]:
    """How often the proxy's answer check, fed this run's answers in order (without their citations, as the proxy
    compares them), agreed on the compared pairs that need one answer and on the others (comparisons before it was
    ready left out, as the proxy leaves them out)."""
    check = AnswerAgreement(cut)
    agreed = {True: [0, 0], False: [0, 0]}
    compared = iter(tally.compared)
    pending = next(compared, None)
    for text in tally.answers:
        check.learn(without_citations(text))
        while pending is not None and pending[1] == text:
            cached, fresh, first, second, alike = pending
            if check.ready:
                agreed[alike][0] += check.agree(without_citations(cached), without_citations(fresh), (first, second))
                agreed[alike][1] += 1
            pending = next(compared, None)
    return {"same_answer_pairs": agreed[True][1], "agreed_on_same_answer": _share(*agreed[True]),
            "other_pairs": agreed[False][1], "agreed_on_other": _share(*agreed[False])}


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _veto(guards: Sequence[str]) -> Any:
    return lambda a, b: bool(guards) and veto(a, b, guards) is not None


async def admin_stats(admin_port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{admin_port}/admin/stats") as r:
        return dict(await r.json())


def select(args: argparse.Namespace) -> tuple[list[LabelledPair], dict[str, int]]:
    """The run's pairs and every question's cluster (clusters from the whole file)."""
    pairs = read_pairs(args.pairs, labels=args.labels)
    by_question = clusters(pairs)
    if args.half != "all":
        pairs = [p for p in pairs if half_of(p) == args.half]
    count = args.count or (300 if args.quick else None)
    if args.mix is not None:
        return sample_mix(pairs, by_question, args.mix, count or 1500, args.seed), by_question
    return pairs[:count] if count else pairs, by_question


def identity(pairs_path: Path, labels: str, extra: Path | None) -> tuple[dict[str, int], ExtraUse | None]:
    """Every question's cluster (answer identity) from the pairs file, joined and kept apart by ``extra``'s labels
    where given (:func:`loadtest.cross_pairs.with_extra`)."""
    pairs = read_pairs(pairs_path, labels=labels)
    if extra is None:
        return clusters(pairs), None
    return with_extra(pairs, read_extra(extra))


def _snapshot(path: Path) -> Path:
    """A private copy of ``path`` (a file edited during a run must not reach the upstream double changed)."""
    copy = Path(tempfile.mkdtemp(prefix="ragproxy-fidelity-labels-")) / path.name
    shutil.copyfile(path, copy)
    return copy


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    pairs, _ = select(args)  # the draw by the file's own labels: the same pairs with or without extra labels
    labels = _snapshot(args.extra_labels) if args.extra_labels else None  # the bench and its double read one copy
    by_question, extra = identity(args.pairs, args.labels, labels)
    l2 = L2Settings()
    from proxy.assembly.config import load_settings

    bound = load_settings(None).cache.l2.max_wrong_hit_rate
    upstream_port, admin_port = free_port(), free_port()
    env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": f"http://127.0.0.1:{upstream_port}"}]),
           "RAGPROXY_DATA_DIR": tempfile.mkdtemp(prefix="ragproxy-fidelity-"),
           "RAGPROXY_ADMIN__PORT": str(admin_port)}
    tally = Tally(dict(by_question), one_prompt=args.rag_prompt == "one")
    upstream = ["-m", "loadtest.bench.fidelity", "--serve-upstream", str(upstream_port), str(args.pairs), args.labels,
                args.answers, str(args.seed), args.rag_cite, str(args.rag_quote), str(labels or "")]
    with contextlib.ExitStack() as stack:
        vectors: dict[str, np.ndarray] = {}
        if args.rag:
            qdrant_port = free_port()
            stack.enter_context(child(["-m", "upstream_doubles.qdrant_shim", "--port", str(qdrant_port)], qdrant_port))
            env["RAGPROXY_UPSTREAMS__QDRANT__URL"] = f"http://127.0.0.1:{qdrant_port}"
            vectors = asyncio.run(_load_corpus(args, pairs, f"http://127.0.0.1:{qdrant_port}"))
        stack.enter_context(child(upstream, upstream_port))
        url = stack.enter_context(proxy_process(env))
        if args.rag:
            tally.rag = RagLoop(Retriever(url, args.rag, vectors, titled=args.rag_cite == "title"), args.rag_form)
        asyncio.run(_warm(url))
        if args.mode == "variants":
            asyncio.run(run_variants(url, pairs, tally, args.seed))
        else:
            if args.rag and args.mode != "shared":
                raise SystemExit("--rag runs in --mode shared only")
            runner = {"shared": run_shared, "pairwise": run_pairwise, "population": run_population}[args.mode]
            asyncio.run(runner(url, pairs, tally))
        time.sleep(0.5)  # the last comparisons run in the background
        stats = asyncio.run(admin_stats(admin_port)).get("tiers", {}).get("l2", {})
    report: dict[str, Any] = {
        "bench": "fidelity", "mode": args.mode, "prompt": args.rag_prompt, "labels": args.labels,
        "answers": args.answers, "half": args.half,
        "mix": args.mix, "seed": args.seed, "pairs": len(pairs), "bound": bound,
        "recall": round(tally.recall, 4), "wrong_hit_share": round(tally.wrong_share, 4), "hits": tally.hits,
        "wrong_hits": tally.wrong, "wrong_semantic_hits": tally.wrong_semantic,
        "same_answer_questions": tally.wanted, "first_semantic_hit_at": tally.first_hit,
        "hit_p50_ms": percentiles(tally.hit_s)["p50_ms"] if tally.hit_s else None,
        "hit_p99_ms": percentiles(tally.hit_s)["p99_ms"] if tally.hit_s else None,
        "exact_hit_p50_ms": percentiles(tally.exact_s)["p50_ms"] if tally.exact_s else None,
        "semantic_hits_timed": len(tally.hit_s),
        "proxy_semantic_hits": stats.get("hits"), "proxy_compared": stats.get("compared"),
        "proxy_disagreed": stats.get("disagreed"), "proxy_verified": stats.get("verified"),
        "proxy_vetoes": stats.get("vetoes"),
        "proxy_estimate": {name: row for name, row in stats.get("namespaces", {}).items() if "/" in name},
    }
    if tally.rag is not None:
        rag = tally.rag
        report.update({"rag_k": args.rag, "rag_form": rag.form, "rag_prompt": args.rag_prompt,
                       "rag_cite": args.rag_cite, "rag_quote": args.rag_quote,
                       "identical_documents_share": _share(rag.identical_documents, len(pairs)),
                       "same_document_set_share": _share(rag.same_document_set, len(pairs)),
                       "miscited_hits": rag.miscited, "searches": rag.retriever.searches,
                       "searches_answered_by_search_cache": rag.retriever.cached})
    if args.mode == "variants":
        report.update({"exact_hits": tally.exact_hits, "first_repeats": tally.first_repeats,
                       "first_repeat_hits": tally.first_repeat_hits,
                       "first_repeat_hit_share": _share(tally.first_repeat_hits, tally.first_repeats)})
    else:
        vectors = asyncio.run(embed_all(list(dict.fromkeys(q for p in pairs for q in (p.question1, p.question2)))))
        build = oracle_population_curve if args.mode == "population" else oracle_curve
        curve = build(pairs, vectors, by_question, _veto(l2.guards))
        oracle = best_at(curve, bound)
        report.update({
            "oracle": oracle, "oracle_recall_ratio": round(tally.recall / oracle["recall"], 3)
            if oracle and oracle["recall"] else None,
            "curve": [{k: round(v, 4) for k, v in row.items()} for row in curve]})
        if tally.compared:
            report["answer_check"] = answer_check_rates(tally, l2.answer_agreement)
        if args.dump_cross is not None:
            near = nearest_cross(tally.order, vectors, tally.by_question)
            report.update({"served_across": len(tally.served_across),
                           "cross_pairs": write_cross(args.dump_cross, [*tally.served_across, *near])})
    if extra is not None:
        report.update({"extra_labels_read": extra.read, "extra_labels_joined": extra.joined,
                       "extra_labels_apart": extra.apart, "extra_labels_conflicting": extra.conflicting})
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


async def _load_corpus(args: argparse.Namespace, pairs: Sequence[LabelledPair],
                       qdrant_url: str) -> dict[str, np.ndarray]:
    """Load the corpus of questions not in the traffic into Qdrant; every text's vector (corpus and traffic)."""
    questions = list(dict.fromkeys(q for p in pairs for q in (p.question1, p.question2)))
    documents = corpus(args.rag_corpus or args.pairs, questions, args.rag_corpus_size)
    vectors = await embed_all(documents + questions)
    async with aiohttp.ClientSession() as session:
        await load(session, qdrant_url, documents, vectors)
    return vectors


async def _warm(url: str) -> None:
    """Wait until the proxy's embedder has loaded (its first L2 lookup would otherwise time the model load)."""
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            await _ask(session, url, f"warm-up question {i}?", "warm-up")


def print_report(report: dict[str, Any]) -> None:
    print(f"fidelity, {report['mode']}, {report['prompt']} system prompt, {report['labels']} labels, "
          f"{report['answers']} answers, half {report['half']}, mix {report['mix']}: {report['pairs']} pairs, "
          f"{report['same_answer_questions']} needing a cached answer")
    if report["mode"] == "variants":
        print(f"trivial variants: {report['first_repeat_hits']}/{report['first_repeats']} first repeats served as HIT "
              f"({report['first_repeat_hit_share']}); {report['exact_hits']} HIT and {report['hits']} hits in all, "
              f"{report['wrong_hits']} wrong; HIT p50 {report['exact_hit_p50_ms']} ms")
    else:
        print(f"{'threshold':>9} {'recall':>7} {'wrong':>7} {'hits':>6}   (hindsight: each fixed threshold)")
        for row in report["curve"]:
            print(f"{row['threshold']:>9.2f} {row['recall']:>7.3f} {row['wrong_hit_share']:>7.3f} {row['hits']:>6}")
        print(f"proxy at its defaults: recall {report['recall']}, wrong-hit share {report['wrong_hit_share']} "
              f"({report['wrong_hits']}/{report['hits']} hits, {report['wrong_semantic_hits']} of them semantic, bound "
              f"{report['bound']}); oracle {report['oracle']}; "
              f"recall / oracle recall {report['oracle_recall_ratio']}; first semantic hit at pair "
              f"{report['first_semantic_hit_at']}")
        if "rag_k" in report:
            print(f"RAG loop, top-{report['rag_k']} own documents, {report['rag_form']}, {report['rag_prompt']} system "
                  f"prompt, citing {report['rag_cite']}, quoting {report['rag_quote']} words: pairs with identical "
                  f"documents {report['identical_documents_share']} (same set {report['same_document_set_share']}); "
                  f"hits citing a source the request lacks where cited {report['miscited_hits']}; "
                  f"{report['searches_answered_by_search_cache']}/{report['searches']} searches from the search "
                  f"cache")
        print(f"semantic hit p50 {report['hit_p50_ms']} ms, p99 {report['hit_p99_ms']} ms "
              f"({report['semantic_hits_timed']} hits); exact hit p50 {report['exact_hit_p50_ms']} ms (same run)")
        print(f"answer check on this run's answers: {report.get('answer_check')}")
    print(f"proxy: {report['proxy_semantic_hits']} semantic hits counted, {report['proxy_compared']} answers compared, "
          f"{report['proxy_disagreed']} disagreed, {report['proxy_verified']} would-be hits verified, vetoes "
          f"{report['proxy_vetoes']}; its estimate: "
          f"{report['proxy_estimate']}")
    if "extra_labels_read" in report:
        print(f"extra labels: {report['extra_labels_read']} read, {report['extra_labels_joined']} joined two clusters, "
              f"{report['extra_labels_apart']} kept two apart, {report['extra_labels_conflicting']} labelled different "
              f"but joined by other labels")
    if "cross_pairs" in report:
        print(f"cross-question pairs written: {report['cross_pairs']} ({report['served_across']} hits across clusters)")
    print(f"elapsed {report['elapsed_s']} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=Path, required=True,
                        help="CSV question1,question2,is_duplicate[,same_answer] "
                        "(../shared/data/qqp_dev_relabelled.csv)")
    parser.add_argument("--labels", choices=LABELS, default="same_answer",
                        help="same_answer (where given; is_duplicate elsewhere) or is_duplicate")
    parser.add_argument("--mode", choices=("shared", "pairwise", "population", "variants"), default="shared")
    parser.add_argument("--mix", type=float, help="share of pairs needing the same answer (sampled; default: as they "
                        "come)")
    parser.add_argument("--count", type=int, help="pairs (default: all, 1500 with --mix, 300 with --quick)")
    parser.add_argument("--answers", choices=("fixed", "varied"), default="fixed",
                        help="one text per cluster, or worded anew every time like a sampling LLM")
    parser.add_argument("--half", choices=(*HALVES, "all"), default="held-out",
                        help="one deterministic half of the pairs (default: held-out, the half the prior curve and the "
                        "default guards were not chosen on)")
    parser.add_argument("--seed", type=int, default=1, help="of the --mix draw, the variants and the varied answers")
    parser.add_argument("--quick", action="store_true", help="300 pairs")
    parser.add_argument("--rag", type=int, metavar="K", help="RAG loop: each question carries its own top-K "
                        "documents (ragproxy.documents, retrieval order) under one system prompt (--mode shared)")
    parser.add_argument("--rag-form", choices=FORMS, default="structured",
                        help="how documents are sent: ragproxy.documents, or pasted into the user message")
    parser.add_argument("--rag-prompt", choices=("pair", "one"), default="pair",
                        help="each pair under its own system prompt, or all under one (--mode shared; with or "
                        "without --rag)")
    parser.add_argument("--rag-cite", choices=CITES, default="auto",
                        help="how the upstream's answer cites its first document: auto (by id when structured, by "
                        "position when inline), position [1], id [doc-N], source-id [source: doc-N], title "
                        '(from "Knowledge base entry N"; documents sent with titles), none')
    parser.add_argument("--rag-quote", type=int, default=0, metavar="N",
                        help="the upstream's answer also quotes the first N words of its first document (its content "
                        "comes from it)")
    parser.add_argument("--rag-corpus", type=Path, help="CSV whose questions not in the traffic are the documents "
                        "(default: the pairs file)")
    parser.add_argument("--rag-corpus-size", type=int, default=5000, help="documents in the corpus")
    parser.add_argument("--extra-labels", type=Path, metavar="PATH", help="CSV question1,question2,same_answer for "
                        "pairs the file does not hold: 1 joins the two questions' clusters (the upstream's answers and "
                        "the count of wrong hits), 0 keeps them apart")
    parser.add_argument("--dump-cross", type=Path, metavar="PATH", help="write CSV question1,question2: the hits "
                        "across clusters and each question's nearest earlier question of another cluster (cosine "
                        f">= {NEAR})")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.mix is not None and not 0 <= args.mix <= 1:
        parser.error("--mix must be between 0 and 1")
    if args.rag_prompt == "one" and args.mode != "shared":
        parser.error("--rag-prompt one runs in --mode shared only")
    if args.rag_cite in BY_ID and args.rag_form != "structured":
        parser.error(f"--rag-cite {args.rag_cite} needs --rag-form structured (pasted sources carry no id or title)")
    report = run(args)
    print_report(report)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    sys.stdout.flush()
    return 0


def _serve_upstream(port: int, pairs_path: str, labels: str, answers: str, seed: int, cite: str, quote: int,
                    extra: str) -> None:
    by_question, _ = identity(Path(pairs_path), labels, Path(extra) if extra else None)
    upstream = ClusterAnswerUpstream(by_question, SampledAnswers(seed) if answers == "varied" else None, cite, quote)
    web.run_app(upstream.app(), host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    if len(sys.argv) == 10 and sys.argv[1] == "--serve-upstream":
        _serve_upstream(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7],
                        int(sys.argv[8]), sys.argv[9])
    else:
        raise SystemExit(main(sys.argv[1:]))
