"""``python -m loadtest.bench scale [--quick] [--json]``: three replicas sharing one cache vs three isolated ones.

Workload: ``--requests`` chat-like requests whose questions follow a Zipf law (exponent ``--zipf``) over
``--distinct`` questions, dealt round-robin to 3 replicas (what a load balancer without affinity does). Each
request is a lookup in the replica's L1 tier; a miss stores the answer (a 2 KiB body), as the proxy does after
the upstream call.

- isolated (baseline, embedded mode): each replica has its own in-process L1 (``MemoryStore``);
- shared (shared mode): each replica has :func:`proxy.shared.build_shared`'s L1 — near cache + one Redis +
  the invalidation bus — on a redis-server this benchmark starts on a free loopback port.

Same per-replica memory budget in both (``--l1-mb``). Then ``--invalidations`` single-key invalidations from
replica A: the time until the call returns (every replica acknowledged), p50/p99, and a check that B and C
miss right after each call. Last, routing quality with and without shared prefix summaries
(:func:`routing_hit_ratio`: a stand-in router over :class:`~proxy.shared.PrefixSummaryBoard`, 2 modelled
backends, 30 document contexts drawn Zipf 1.0). The last output line with ``--json`` carries ``shared_hit_ratio``,
``isolated_hit_ratio``, ``hit_ratio_gain``, ``invalidation_p50_ms``, ``invalidation_p99_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from proxy.config import load_settings
from proxy.kv.hints import prefix_hashes as path_hashes
from proxy.shared import PrefixSummaryBoard, SharedMode, build_shared
from tiers.entry import CachedResponse
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier

REPLICAS = 3


def workload(requests: int, distinct: int, zipf: float, seed: int = 7) -> list[int]:
    """Question ids drawn from a bounded Zipf law."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, distinct + 1) ** zipf
    return [int(x) for x in rng.choice(distinct, size=requests, p=weights / weights.sum())]


def _entry(question: int) -> CachedResponse:
    """A 2 KiB answer that does not compress (random text), so byte budgets mean what they say."""
    text = base64.b64encode(random.Random(question).randbytes(1536))
    return CachedResponse(body=b'{"answer": "' + text + b'"}', kind="chat", model="m")


async def hit_ratio(tiers: list[ResponseTier], questions: list[int]) -> float:
    hits = 0
    for index, question in enumerate(questions):
        tier = tiers[index % REPLICAS]
        key = f"q{question}"
        if await tier.get(key) is not None:
            hits += 1
        else:
            await tier.put(key, _entry(question), ttl=3600, tags=["all"])
    return hits / len(questions)


BACKENDS = ("gpu-0", "gpu-1")


async def routing_hit_ratio(url: str, contexts: list[int], *, shared: bool, capacity: int = 12,
                            refresh_every: int = 10) -> float:
    """Share of prompt tokens found in the chosen backend's KV cache when 3 replicas route by what their
    :class:`PrefixSummaryBoard` knows: the backend with the longest known cached prefix, else the one that got
    the fewest requests. Each backend's KV cache is modelled as an LRU of ``capacity`` contexts (2,000 tokens
    each, plus a 50-token question); ``shared=False`` gives every replica a board of its own."""
    client = aioredis.Redis.from_url(url)
    boards = [PrefixSummaryBoard(client, BACKENDS, prefix="bench-shared" if shared else f"bench-own-{n}",
                                 ttl_s=60) for n in range(REPLICAS)]
    caches: dict[str, list[int]] = {b: [] for b in BACKENDS}
    sent = dict.fromkeys(BACKENDS, 0)
    cached_tokens = total_tokens = 0
    try:
        for index, context in enumerate(contexts):
            board = boards[index % REPLICAS]
            hashes = path_hashes([f"context {context}", f"question {index}"])
            backend = max(BACKENDS, key=lambda b: (board.cached_tokens(b, hashes), -sent[b]))
            sent[backend] += 1
            cache = caches[backend]
            if context in cache:
                cached_tokens += 2000
                cache.remove(context)
            cache.append(context)
            del cache[:-capacity]
            total_tokens += 2050
            board.record(backend, [(hashes[0], 2000)])
            if index % refresh_every == refresh_every - 1:
                for each in boards:
                    await each.publish()
                    await each.refresh()
    finally:
        await client.aclose()
    return cached_tokens / total_tokens


def _start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    from tests.support.processes import free_port, wait_for_port

    port = free_port()
    directory = tempfile.mkdtemp(prefix="ragproxy-bench-redis-")
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no", "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return process, f"redis://127.0.0.1:{port}/0", directory


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    questions = workload(args.requests, args.distinct, args.zipf)
    budget = args.l1_mb * 1024 * 1024
    settings = load_settings(env={}, overrides={"redis.url": url, "cache.l1.max_bytes": budget})
    policy = settings.cache.l1.policy  # the same eviction policy for the isolated L1s and the near caches
    isolated = [ResponseTier("l1", MemoryStore(make_policy(policy, budget))) for _ in range(REPLICAS)]
    isolated_ratio = await hit_ratio(isolated, questions)

    replicas: list[SharedMode] = []
    for _ in range(REPLICAS):
        shared = build_shared(settings)
        assert shared is not None
        await shared.start()
        replicas.append(shared)
    try:
        started = time.perf_counter()
        shared_ratio = await hit_ratio([r.l1 for r in replicas], questions)
        shared_s = time.perf_counter() - started
        latencies: list[float] = []
        stale = 0
        a, b, c = replicas
        for n in range(args.invalidations):
            key = f"inv{n}"
            await a.l1.put(key, _entry(n), ttl=60, tags=["all"])
            await b.l1.get(key)
            await c.l1.get(key)  # near copies on B and C
            begun = time.perf_counter()
            await a.l1.delete(key)
            latencies.append((time.perf_counter() - begun) * 1000)
            stale += sum([await r.l1.get(key) is not None for r in (b, c)])
    finally:
        for shared in replicas:
            await shared.stop()
    contexts = workload(args.requests // 3, 30, 1.0, seed=11)
    routing_own = await routing_hit_ratio(url, contexts, shared=False)
    routing_shared = await routing_hit_ratio(url, contexts, shared=True)
    latencies.sort()
    return {
        "replicas": REPLICAS, "requests": args.requests, "distinct": args.distinct, "zipf": args.zipf,
        "l1_mb": args.l1_mb,
        "isolated_hit_ratio": round(isolated_ratio, 4), "shared_hit_ratio": round(shared_ratio, 4),
        "hit_ratio_gain": round(shared_ratio / isolated_ratio, 3) if isolated_ratio else None,
        "shared_requests_per_s": round(args.requests / shared_s, 1),
        "invalidations": args.invalidations,
        "invalidation_p50_ms": round(statistics.median(latencies), 3),
        "invalidation_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
        "stale_reads_after_invalidation": stale,
        "routing_prefix_hit_own_boards": round(routing_own, 4),
        "routing_prefix_hit_shared_board": round(routing_shared, 4),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench scale")
    parser.add_argument("--quick", action="store_true", help="a smaller run (well under 60 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--distinct", type=int, default=None)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--l1-mb", type=int, default=64)
    parser.add_argument("--invalidations", type=int, default=None)
    args = parser.parse_args(argv)
    args.requests = args.requests or (6000 if args.quick else 30000)
    args.distinct = args.distinct or (4000 if args.quick else 20000)
    args.invalidations = args.invalidations or (200 if args.quick else 1000)
    process, url, directory = _start_redis()
    try:
        result = asyncio.run(run(args, url))
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)
    print(f"workload: {result['requests']} requests, Zipf {result['zipf']} over {result['distinct']} questions, "
          f"round-robin over {REPLICAS} replicas, {result['l1_mb']} MiB L1 each")
    print(f"hit ratio  isolated {result['isolated_hit_ratio']:.3f}   shared {result['shared_hit_ratio']:.3f}   "
          f"gain x{result['hit_ratio_gain']} (goal >= 2)")
    print(f"invalidation until every replica acknowledged: p50 {result['invalidation_p50_ms']} ms, "
          f"p99 {result['invalidation_p99_ms']} ms (goal p99 <= 100 ms); stale reads after the call: "
          f"{result['stale_reads_after_invalidation']}")
    own, shared = result["routing_prefix_hit_own_boards"], result["routing_prefix_hit_shared_board"]
    print(f"KV prefix tokens reused when routing by prefix summaries: own boards {own:.3f}, shared board {shared:.3f}")
    if args.json:
        print(json.dumps(result))
    return 0
