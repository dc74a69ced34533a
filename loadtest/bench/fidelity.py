"""``python -m loadtest.bench fidelity --pairs PATH [--mode pairwise|population] [--half H] [--quick] [--json]``: L2
on real labelled question pairs, through a real ``ragproxy serve`` at its defaults.

Input: a CSV of ``question1,question2,is_duplicate`` (e.g. ``../shared/data/qqp_dev.csv``; read from the path
given, never shipped). Clusters are the connected components of the ``is_duplicate=1`` pairs. The upstream is
:class:`ClusterAnswerUpstream`, a test double speaking the OpenAI chat wire format: a deterministic model that
answers every question of one cluster with the same text (pseudo-random words seeded by the cluster), so an answer
names the cluster it belongs to. A cached answer served for a question of another cluster is a wrong hit.

Modes (the proxy starts empty for each):

- ``pairwise``: each pair alone. For pair *i* the client asks ``question1`` then ``question2``, both under a system
  message ``"pair <i>"``: every pair has its own context signature, so its own L2 partition, and sees no other
  pair's questions; all pairs share the namespace, so the namespace's calibration learns from all of them.
  (Pairs are sent in blocks of 64: first questions, then second questions, so each first answer is stored.)
- ``population``: one context for all. Every distinct ``question1`` is asked first (each one a miss, or a hit on
  an earlier first question), then every distinct ``question2`` not among them; each question sees every cached
  question before it.

Figures, over second questions: **recall** = second questions of duplicate pairs answered from cache with their
cluster's answer / second questions of duplicate pairs; **wrong-hit share** = hits whose answer belongs to another
cluster / hits; **hit p50/p99** of ``SEMANTIC_HIT`` responses (HTTP round trip, embedding included) against the
exact-hit p50 measured in the same run (each first question asked again). Baseline: the **plain-cosine frontier**,
computed in the same run with the proxy's own embedder (same model, runtime, vectors): the same mode replayed with a
bare cosine threshold of 0.80...0.98 and no guards nor calibration (population: each question's 32 nearest earlier
questions stand in for the index; the stored set is replayed exactly), reported at the run's recall by linear
interpolation. ``--half`` keeps one deterministic half (:func:`proxy.calibrate.half_of`): report ``held-out``
figures, the defaults were set on ``calibration``. ``--quick``: the first 800 pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web

from loadtest.harness import child, free_port, percentiles, proxy_process
from proxy.calibrate import HALVES, LabelledPair, half_of, read_pairs

FRONTIER = tuple(round(0.80 + 0.01 * i, 2) for i in range(19))
BLOCK = 64
NEIGHBOURS = 32
_WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kelp",
          "lumen", "meadow", "nectar", "onyx", "prairie", "quartz", "russet", "sierra", "tundra", "umber", "velvet",
          "willow", "xenon", "yarrow", "zephyr")


def clusters(pairs: Sequence[LabelledPair]) -> dict[str, int]:
    """Question → cluster number: connected components of the duplicate pairs (union-find)."""
    parent: dict[str, str] = {}

    def find(q: str) -> str:
        parent.setdefault(q, q)
        while parent[q] != q:
            parent[q] = parent[parent[q]]
            q = parent[q]
        return q

    for pair in pairs:
        a, b = find(pair.question1), find(pair.question2)
        if pair.duplicate and a != b:
            parent[a] = b
    roots: dict[str, int] = {}
    return {q: roots.setdefault(find(q), len(roots)) for q in list(parent)}


def cluster_answer(cluster: int) -> str:
    """The fixed answer of one cluster: 24 pseudo-random words seeded by its number."""
    rng = random.Random(cluster)
    return f"Answer {cluster}: " + " ".join(rng.choice(_WORDS) for _ in range(24))


class ClusterAnswerUpstream:
    """Test double of an OpenAI-compatible backend: answers a question with its cluster's text."""

    def __init__(self, by_question: dict[str, int]) -> None:
        self.by_question = by_question

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            question = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
            cluster = self.by_question.get(question)
            text = cluster_answer(cluster) if cluster is not None else "Unknown question: " + question
            return web.json_response({
                "id": "chatcmpl-fidelity", "object": "chat.completion", "created": 1700000000,
                "model": body.get("model", "fidelity"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


@dataclass(slots=True)
class Tally:
    """Outcomes of second questions."""

    duplicates: int = 0
    recalled: int = 0
    hits: int = 0
    wrong: int = 0
    hit_s: list[float] = field(default_factory=list)
    exact_s: list[float] = field(default_factory=list)

    def count(self, duplicate: bool, hit: bool, right: bool) -> None:
        self.duplicates += duplicate
        self.hits += hit
        self.wrong += hit and not right
        self.recalled += duplicate and hit and right

    @property
    def recall(self) -> float:
        return self.recalled / self.duplicates if self.duplicates else 0.0

    @property
    def wrong_share(self) -> float:
        return self.wrong / self.hits if self.hits else 0.0


def _body(question: str, context: str | None) -> bytes:
    messages = ([{"role": "system", "content": context}] if context else []) + [{"role": "user", "content": question}]
    return orjson.dumps({"model": "fidelity", "messages": messages})


async def _ask(session: aiohttp.ClientSession, url: str, question: str, context: str | None) -> tuple[str, str, float]:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=_body(question, context),
                            headers={"Content-Type": "application/json"}) as response:
        payload = await response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"proxy answered {response.status}: {payload[:200]!r}")
        text = orjson.loads(payload)["choices"][0]["message"]["content"]
        return response.headers.get("X-Cache-Status", ""), text, elapsed


def _judge(tally: Tally, status: str, text: str, elapsed: float, question: str, duplicate: bool,
           by_question: dict[str, int]) -> None:
    hit = status in ("HIT", "SEMANTIC_HIT")
    tally.count(duplicate, hit, text == cluster_answer(by_question[question]))
    if status == "SEMANTIC_HIT":
        tally.hit_s.append(elapsed)


async def run_pairwise(url: str, pairs: Sequence[LabelledPair], by_question: dict[str, int]) -> Tally:
    tally = Tally()
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(pairs), BLOCK):
            block = list(enumerate(pairs[start:start + BLOCK], start))
            for i, pair in block:
                await _ask(session, url, pair.question1, f"pair {i}")
            await asyncio.sleep(0.05)  # the last answers' index entries are written just after they are sent
            for i, pair in block:
                status, text, elapsed = await _ask(session, url, pair.question2, f"pair {i}")
                _judge(tally, status, text, elapsed, pair.question2, pair.duplicate, by_question)
            for i, pair in block[:4]:
                status, _, elapsed = await _ask(session, url, pair.question1, f"pair {i}")
                if status == "HIT":
                    tally.exact_s.append(elapsed)
    return tally


def population_order(pairs: Sequence[LabelledPair]) -> tuple[list[str], list[tuple[str, bool]]]:
    """Distinct first questions, then distinct second questions not among them (duplicate if any pair says so)."""
    firsts = list(dict.fromkeys(p.question1 for p in pairs))
    seen = set(firsts)
    seconds: dict[str, bool] = {}
    for pair in pairs:
        if pair.question2 not in seen:
            seconds[pair.question2] = seconds.get(pair.question2, False) or pair.duplicate
    return firsts, list(seconds.items())


async def run_population(url: str, pairs: Sequence[LabelledPair], by_question: dict[str, int]) -> Tally:
    tally = Tally()
    firsts, seconds = population_order(pairs)
    async with aiohttp.ClientSession() as session:
        for question in firsts:
            await _ask(session, url, question, None)
        await asyncio.sleep(0.2)
        for question, duplicate in seconds:
            status, text, elapsed = await _ask(session, url, question, None)
            _judge(tally, status, text, elapsed, question, duplicate, by_question)
        for question in firsts[:256]:
            status, _, elapsed = await _ask(session, url, question, None)
            if status == "HIT":
                tally.exact_s.append(elapsed)
    return tally


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


def frontier_pairwise(pairs: Sequence[LabelledPair], vectors: dict[str, np.ndarray],
                      by_question: dict[str, int]) -> list[dict[str, float]]:
    score = np.array([float(np.dot(vectors[p.question1], vectors[p.question2])) for p in pairs])
    right = np.array([by_question[p.question1] == by_question[p.question2] for p in pairs])
    duplicate = np.array([p.duplicate for p in pairs])
    rows = []
    for threshold in FRONTIER:
        hit = score >= threshold
        rows.append({"threshold": threshold, "recall": float((hit & right & duplicate).sum() / max(duplicate.sum(), 1)),
                     "wrong_hit_share": float((hit & ~right).sum() / hit.sum()) if hit.any() else 0.0})
    return rows


def frontier_population(pairs: Sequence[LabelledPair], vectors: dict[str, np.ndarray],
                        by_question: dict[str, int]) -> list[dict[str, float]]:
    firsts, seconds = population_order(pairs)
    order = firsts + [q for q, _ in seconds]
    matrix = np.stack([vectors[q] for q in order])
    nearest: list[np.ndarray] = []
    for i in range(len(order)):  # each question's nearest earlier questions, most similar first
        if i == 0:
            nearest.append(np.zeros(0, dtype=np.int64))
            continue
        similarity = matrix[:i] @ matrix[i]
        top = np.argsort(-similarity)[:NEIGHBOURS]
        nearest.append(top)
    rows = []
    for threshold in FRONTIER:
        answer: dict[int, int] = {}  # stored question index → cluster of its answer
        tally = Tally()
        for i, question in enumerate(order):
            served = None
            for j in nearest[i]:
                if int(j) in answer:
                    if float(matrix[j] @ matrix[i]) >= threshold:
                        served = answer[int(j)]
                    break
            if served is None:
                answer[i] = by_question[question]
            if i >= len(firsts):
                tally.count(seconds[i - len(firsts)][1], served is not None, served == by_question[question])
        rows.append({"threshold": threshold, "recall": tally.recall, "wrong_hit_share": tally.wrong_share})
    return rows


def at_recall(frontier: Sequence[dict[str, float]], recall: float) -> float | None:
    """The frontier's wrong-hit share at ``recall`` (linear interpolation; ``None`` outside its range)."""
    points = sorted((row["recall"], row["wrong_hit_share"]) for row in frontier)
    if not points or not points[0][0] <= recall <= points[-1][0]:
        return None
    return float(np.interp(recall, [p[0] for p in points], [p[1] for p in points]))


async def admin_stats(admin_port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{admin_port}/admin/stats") as r:
        return dict(await r.json())


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    pairs = read_pairs(args.pairs)
    by_question = clusters(pairs)
    if args.half != "all":
        pairs = [p for p in pairs if half_of(p) == args.half]
    if args.quick:
        pairs = pairs[:800]
    upstream_port, admin_port = free_port(), free_port()
    env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": f"http://127.0.0.1:{upstream_port}"}]),
           "RAGPROXY_DATA_DIR": tempfile.mkdtemp(prefix="ragproxy-fidelity-"),
           "RAGPROXY_ADMIN__PORT": str(admin_port)}
    with child(["-m", "loadtest.bench.fidelity", "--serve-upstream", str(upstream_port), str(args.pairs)],
               upstream_port), proxy_process(env) as url:
        asyncio.run(_warm(url))
        runner = run_pairwise if args.mode == "pairwise" else run_population
        tally = asyncio.run(runner(url, pairs, by_question))
        stats = asyncio.run(admin_stats(admin_port)).get("tiers", {}).get("l2", {})
    vectors = asyncio.run(embed_all(list(dict.fromkeys(q for p in pairs for q in (p.question1, p.question2)))))
    build = frontier_pairwise if args.mode == "pairwise" else frontier_population
    frontier = build(pairs, vectors, by_question)
    baseline = at_recall(frontier, tally.recall)
    hit = percentiles(tally.hit_s) if tally.hit_s else {"p50_ms": None, "p99_ms": None}
    exact = percentiles(tally.exact_s) if tally.exact_s else {"p50_ms": None}
    return {
        "bench": "fidelity", "mode": args.mode, "half": args.half, "pairs": len(pairs),
        "recall": round(tally.recall, 4), "wrong_hit_share": round(tally.wrong_share, 4), "hits": tally.hits,
        "wrong_hits": tally.wrong, "duplicate_second_questions": tally.duplicates,
        "frontier_wrong_at_equal_recall": None if baseline is None else round(baseline, 4),
        "ratio_to_frontier": None if not baseline else round(tally.wrong_share / baseline, 3),
        "hit_p50_ms": hit["p50_ms"], "hit_p99_ms": hit["p99_ms"], "exact_hit_p50_ms": exact["p50_ms"],
        "semantic_hits_timed": len(tally.hit_s),
        "proxy_estimate": {name: row for name, row in stats.get("namespaces", {}).items()
                           if name.split("/")[-1] == "default"},  # the prior, then the tenant's own evidence
        "proxy_compared": stats.get("compared"), "proxy_disagreed": stats.get("disagreed"),
        "frontier": [{k: round(v, 4) for k, v in row.items()} for row in frontier],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


async def _warm(url: str) -> None:
    """Wait until the proxy's embedder has loaded (its first L2 lookup would otherwise time the model load)."""
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            await _ask(session, url, f"warm-up question {i}?", "warm-up")


def print_report(report: dict[str, Any]) -> None:
    print(f"fidelity, {report['mode']}, half {report['half']}: {report['pairs']} pairs, "
          f"{report['duplicate_second_questions']} duplicate second questions")
    print(f"{'threshold':>9} {'recall':>7} {'wrong':>7}   (plain-cosine frontier, no guards)")
    for row in report["frontier"]:
        print(f"{row['threshold']:>9.2f} {row['recall']:>7.3f} {row['wrong_hit_share']:>7.3f}")
    print(f"proxy at its defaults: recall {report['recall']}, wrong-hit share {report['wrong_hit_share']} "
          f"({report['wrong_hits']}/{report['hits']} hits); frontier at equal recall "
          f"{report['frontier_wrong_at_equal_recall']}; ratio {report['ratio_to_frontier']}")
    print(f"semantic hit p50 {report['hit_p50_ms']} ms, p99 {report['hit_p99_ms']} ms "
          f"({report['semantic_hits_timed']} hits); exact hit p50 {report['exact_hit_p50_ms']} ms (same run)")
    print(f"proxy's own estimate: {report['proxy_estimate']}; answers compared {report['proxy_compared']}, "
          f"disagreed {report['proxy_disagreed']}")
    print(f"elapsed {report['elapsed_s']} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=Path, required=True,
                        help="CSV question1,question2,is_duplicate (e.g. ../shared/data/qqp_dev.csv)")
    parser.add_argument("--mode", choices=("pairwise", "population"), default="pairwise")
    parser.add_argument("--half", choices=(*HALVES, "all"), default="held-out",
                        help="one deterministic half of the pairs (default: held-out, the half the prior curve and the "
                        "default guards were not chosen on)")
    parser.add_argument("--quick", action="store_true", help="the first 800 pairs")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    report = run(args)
    print_report(report)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    sys.stdout.flush()
    return 0


def _serve_upstream(port: int, pairs_path: str) -> None:
    upstream = ClusterAnswerUpstream(clusters(read_pairs(Path(pairs_path))))
    web.run_app(upstream.app(), host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-upstream":
        _serve_upstream(int(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(main(sys.argv[1:]))
