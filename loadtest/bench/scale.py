"""``python -m loadtest.bench scale [--quick] [--json]``: three replicas sharing one cache vs three isolated ones,
with the same total memory.

Workload (:mod:`loadtest.scale_workload`, which explains every default): real NQ-open questions asked with a
long-tail (Zipf 0.7) popularity, as many requests as questions, dealt round-robin to 3 replicas (a load
balancer without affinity). Each request is a lookup in the replica's L1 tier; a miss stores the answer (a
realistic ``chat.completion`` body with the proxy's tags), as the proxy does after the upstream call.

- isolated (baseline, embedded mode): each replica has its own in-process L1 (``MemoryStore``, policy
  ``cache.l1.policy``) of ``B`` bytes;
- shared (shared mode): :func:`proxy.cache_tiers.shared_mode.build_shared`'s L1 per replica — a near cache of
  ``B/8`` (same policy) in front of one Redis — on a redis-server this benchmark starts on a free loopback port. The
  three near caches plus Redis's value budget add up to ``3B``. Three variants, each a set of JSON keys
  ``<variant>_...``:

  - ``shared`` (the product's defaults): the store's own budget, ``redis.l1_max_bytes`` = the value budget,
    admits and evicts by cost and size (GreedyDual, :mod:`tiers.redis_scripts`), and answers are stored
    lz4-compressed with the built-in dictionary; the budget counts the bytes Redis holds (compressed);
  - ``shared_uncompressed``: the same budget, answers stored raw (the policy's effect alone);
  - ``shared_no_budget``: ``redis.l1_max_bytes=0``, raw: Redis's ``maxmemory`` with ``maxmemory-policy
    volatile-lru`` decides alone, as shared mode did before it had a budget.

Accounting: ``MemoryStore`` counts value bytes only, and so does the Redis store's budget (stored bytes, as
Redis counts them: ``STRLEN``); Redis's own per-entry overhead (key names, the entry's record, the policy's
queue, the tag index, expiry tables) is left out as Python's per-entry overhead in the isolated L1s is. The
benchmark measures that overhead first (bytes Redis uses per stored value byte, writing a sample of the
workload's entries) and sets ``maxmemory`` (``volatile-lru``: only values, which expire, are evicted; never
credits, API keys or versions) to the empty server's memory plus the value budget times that factor — times
``HEADROOM`` (1.25) where the budget is the bound, for memory that does not grow with stored bytes (connection
buffers, tombstones awaiting release, more entries per byte than the calibration sample). Both are reported,
with Redis's ``evicted_keys`` and its memory at the end.

Rows: the default workload (``--zipf``/``--distinct``/``--requests``/``--l1-mb``/``--memory-share``/
``--near-share`` change it) and the head-heavy case (JSON keys ``head_heavy_*``: 6,000 requests, Zipf 0.8 over
4,000 questions, 64 MiB per replica — memory no constraint). Then ``--invalidations`` single-key invalidations
from replica A (Redis unbounded): the time until the call returns (every live replica acknowledged), p50/p99,
and a check that B and C miss right after each call. Last, routing quality with and without shared prefix
summaries (:func:`routing_hit_ratio`: a stand-in router over :class:`~proxy.kv.prefix_board.PrefixSummaryBoard`, 2
modelled backends, 30 document contexts drawn Zipf 1.0). The last output line with ``--json`` carries
``shared_hit_ratio``, ``isolated_hit_ratio``, ``hit_ratio_gain`` (shared over isolated), the other variants'
``<variant>_hit_ratio`` and ``<variant>_hit_ratio_gain``, ``best_possible_hit_ratio`` (every distinct question
missed once, nothing else), their ``head_heavy_`` twins (``shared`` only), ``invalidation_p50_ms`` and
``invalidation_p99_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis

from loadtest.harness import redis_server
from loadtest.scale_workload import HEAD_HEAVY, Shape, Workload, build, zipf_trace
from proxy.assembly.config import load_settings
from proxy.cache_tiers.shared_mode import SharedMode, build_shared
from proxy.kv.hints import prefix_hashes as path_hashes
from proxy.kv.prefix_board import PrefixSummaryBoard
from tiers.entry import CachedResponse
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.redis_store import RedisStore
from tiers.response_tier import ResponseTier

REPLICAS = 3
NQ_OPEN_SIZE = 3610
TTL_S = 3600.0
EVICTION = "volatile-lru"
HEADROOM = 1.25
MIB = 1024 * 1024


async def hit_ratio(tiers: list[ResponseTier], workload: Workload) -> float:
    hits = 0
    for index, question in enumerate(workload.trace):
        tier = tiers[index % REPLICAS]
        entry = workload.entry(question)
        if await tier.get(entry.key) is not None:
            hits += 1
        else:
            await tier.put(entry.key, entry.response, ttl=TTL_S, tags=entry.tags)
    return hits / len(workload.trace)


async def _used_memory(client: aioredis.Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


@dataclass(frozen=True)
class Variant:
    """One configuration of the shared L1 (JSON keys ``<name>_...``)."""

    name: str
    budget: bool
    compress: bool


VARIANTS = (
    Variant("shared", budget=True, compress=True),  # the product's defaults
    Variant("shared_uncompressed", budget=True, compress=False),
    Variant("shared_no_budget", budget=False, compress=False),  # Redis's maxmemory + volatile-lru decide alone
)


async def redis_overhead(client: aioredis.Redis, workload: Workload, *, compress: bool,
                         sample: int = 2000) -> tuple[float, float]:
    """Bytes Redis uses per stored value byte for this workload's entries (keys, records, the policy's queue,
    the tag index and expiries included), and raw answer bytes per stored byte (the compression ratio)."""
    await client.flushall()
    before = await _used_memory(client)
    store = RedisStore(client, prefix="calibration", compress=compress)
    raw_bytes = 0
    for index in workload.distinct_seen[:sample]:
        entry = workload.entry(index)
        raw = entry.response.encode()
        await store.put(entry.key, raw, ttl=TTL_S, tags=entry.tags)
        raw_bytes += len(raw)
    stored = (await store.stats()).bytes
    used = await _used_memory(client) - before
    await client.flushall()
    return used / stored, raw_bytes / stored


async def shared_row(client: aioredis.Redis, url: str, workload: Workload, prefix: str,
                     variant: Variant) -> dict[str, Any]:
    """Hit ratio of 3 shared-mode replicas whose Redis holds the workload's value budget.

    With ``variant.budget`` the bound is the store's own (``redis.l1_max_bytes``, stored bytes as Redis counts
    them), as the isolated L1s' is theirs; ``maxmemory`` (the empty server's memory plus the budget times
    Redis's measured bytes per stored byte) gets ``HEADROOM`` for what does not grow with stored bytes
    (connection buffers, tombstones awaiting release, more entries per byte than the calibration sample) and
    stays the outer bound. Without, ``maxmemory`` is the only bound and gets no headroom."""
    overhead, ratio_stored = await redis_overhead(client, workload, compress=variant.compress)
    settings = load_settings(env={}, overrides={
        "redis.url": url, "cache.l1.max_bytes": workload.near_bytes, "redis.prefix": prefix,
        "redis.l1_max_bytes": workload.redis_bytes if variant.budget else 0, "redis.l1_compress": variant.compress})
    replicas = [build_shared(settings) for _ in range(REPLICAS)]
    started: list[SharedMode] = []
    try:
        for shared in replicas:
            assert shared is not None
            await shared.start()
            started.append(shared)
        baseline = await _used_memory(client)
        maxmemory = baseline + int(workload.redis_bytes * overhead * (HEADROOM if variant.budget else 1.0))
        await client.config_set("maxmemory-policy", EVICTION)
        await client.config_set("maxmemory", str(maxmemory))
        evicted_before = int((await client.info("stats"))["evicted_keys"])
        begun = time.perf_counter()
        ratio = await hit_ratio([r.l1 for r in started], workload)
        elapsed = time.perf_counter() - begun
        stats = await started[0].near.shared.stats()
        evicted = int((await client.info("stats"))["evicted_keys"]) - evicted_before
        used_at_end = await _used_memory(client) - baseline
        stores = [r.near for r in started]
        name = variant.name
        return {
            f"{name}_hit_ratio": round(ratio, 4),
            f"{name}_near_hits": sum(s.near_hits for s in stores),
            f"{name}_redis_hits": sum(s.shared_hits for s in stores),
            f"{name}_tier_errors": sum(r.l1.counters.errors for r in started),
            f"{name}_requests_per_s": round(len(workload.trace) / elapsed, 1),
            f"{name}_policy_evictions": sum(s.shared.evictions for s in stores),
            f"{name}_policy_bypassed": sum(s.shared.bypassed for s in stores),
            f"{name}_compression_ratio": round(ratio_stored, 3),
            f"{name}_redis_overhead_factor": round(overhead, 3),
            f"{name}_redis_maxmemory_mb": round(maxmemory / MIB, 3),
            f"{name}_redis_used_mb_at_end": round(used_at_end / MIB, 3),
            f"{name}_redis_evicted_keys": evicted,
            f"{name}_redis_entries_at_end": stats.entries,
            f"{name}_redis_value_mb_at_end": round(stats.bytes / MIB, 3),
        }
    finally:
        for shared in started:
            await shared.stop()
        await client.config_set("maxmemory", "0")
        await client.flushall()


async def measure_row(client: aioredis.Redis, url: str, workload: Workload, policy: str,
                      prefix: str, variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Any]:
    isolated = [ResponseTier("l1", MemoryStore(make_policy(policy, workload.replica_bytes)))
                for _ in range(REPLICAS)]
    isolated_ratio = await hit_ratio(isolated, workload)
    shape = workload.shape
    row: dict[str, Any] = {
        "zipf": shape.zipf, "distinct": len(workload.questions), "requests": len(workload.trace),
        "distinct_asked": len(workload.distinct_seen), "asked_once_share": round(workload.asked_once_share, 3),
        "working_set_mb": round(workload.working_set_bytes / MIB, 3),
        "replica_budget_mb": round(workload.replica_bytes / MIB, 3), "near_mb": round(workload.near_bytes / MIB, 3),
        "redis_value_budget_mb": round(workload.redis_bytes / MIB, 3),
        "isolated_hit_ratio": round(isolated_ratio, 4),
        "best_possible_hit_ratio": round(1 - len(workload.distinct_seen) / len(workload.trace), 4),
    }
    for variant in variants:
        row.update(await shared_row(client, url, workload, prefix, variant))
        gain = row[f"{variant.name}_hit_ratio"] / isolated_ratio if isolated_ratio else None
        name = "hit_ratio_gain" if variant.name == "shared" else f"{variant.name}_hit_ratio_gain"
        row[name] = None if gain is None else round(gain, 3)
    return row


def _entry(n: int) -> CachedResponse:
    return CachedResponse(body=b'{"answer": "%d"}' % n, kind="chat", model="m")


async def invalidation_latencies(url: str, count: int) -> tuple[list[float], int]:
    """``count`` single-key removals on replica A with near copies on B and C: ms until each call returned,
    and how many reads on B and C still found the entry right after."""
    settings = load_settings(env={}, overrides={"redis.url": url})
    replicas: list[SharedMode] = []
    latencies: list[float] = []
    stale = 0
    try:
        for _ in range(REPLICAS):
            shared = build_shared(settings)
            assert shared is not None
            await shared.start()
            replicas.append(shared)
        a, b, c = replicas
        for n in range(count):
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
    return sorted(latencies), stale


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


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    policy = load_settings(env={}).cache.l1.policy  # the isolated L1s and the near caches use the same one
    shape = Shape(zipf=args.zipf, distinct=args.distinct, requests=args.requests, l1_mb=args.l1_mb,
                  memory_share=args.memory_share, near_share=args.near_share)
    client = aioredis.Redis.from_url(url)
    try:
        default = await measure_row(client, url, build(shape, REPLICAS), policy, "bench-default")
        head_shape = replace(HEAD_HEAVY, near_share=args.near_share)
        head = await measure_row(client, url, build(head_shape, REPLICAS), policy, "bench-head", VARIANTS[:1])
    finally:
        await client.aclose()
    latencies, stale = await invalidation_latencies(url, args.invalidations)
    contexts = zipf_trace(args.routing_requests, 30, 1.0, seed=11)
    routing_own = await routing_hit_ratio(url, contexts, shared=False)
    routing_shared = await routing_hit_ratio(url, contexts, shared=True)
    return {
        "replicas": REPLICAS, "l1_policy": policy, "redis_eviction": EVICTION, **default,
        **{f"head_heavy_{name}": value for name, value in head.items()},
        "invalidations": args.invalidations,
        "invalidation_p50_ms": round(statistics.median(latencies), 3),
        "invalidation_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
        "stale_reads_after_invalidation": stale,
        "routing_prefix_hit_own_boards": round(routing_own, 4),
        "routing_prefix_hit_shared_board": round(routing_shared, 4),
    }


def _describe(result: dict[str, Any], prefix: str, title: str) -> None:
    def get(name: str) -> Any:
        return result[prefix + name]

    source = "NQ-open questions" if get("distinct") <= NQ_OPEN_SIZE else "questions (NQ-open, then numbered variants)"
    print(f"{title}: {get('requests')} requests, Zipf {get('zipf')} over {get('distinct')} {source} "
          f"({get('distinct_asked')} asked, {get('asked_once_share'):.0%} of them once), round-robin over "
          f"{REPLICAS} replicas; working set {get('working_set_mb')} MiB")
    print(f"  memory: isolated {get('replica_budget_mb')} MiB L1 each; shared {get('near_mb')} MiB near cache each "
          f"+ Redis {get('redis_value_budget_mb')} MiB of stored answers")
    print(f"  hit ratio  isolated {get('isolated_hit_ratio'):.3f}   best possible {get('best_possible_hit_ratio'):.3f}")
    for variant in VARIANTS:
        name = variant.name
        if prefix + name + "_hit_ratio" not in result:
            continue
        gain = get("hit_ratio_gain" if name == "shared" else f"{name}_hit_ratio_gain")
        label = ("budget " if variant.budget else "no budget ") + ("+ lz4" if variant.compress else "raw")
        print(f"  {name:<20} ({label}): {get(name + '_hit_ratio'):.3f}  gain x{gain} (goal >= 2); "
              f"{get(name + '_compression_ratio')}x compression, {get(name + '_policy_evictions')} evicted and "
              f"{get(name + '_policy_bypassed')} not admitted by the budget; maxmemory "
              f"{get(name + '_redis_maxmemory_mb')} MiB ({get(name + '_redis_overhead_factor')} bytes per stored "
              f"byte), {get(name + '_redis_evicted_keys')} keys evicted by Redis")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench scale")
    parser.add_argument("--quick", action="store_true", help="fewer invalidations and routing requests")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--requests", type=int, default=None, help="default: as many as questions")
    parser.add_argument("--distinct", type=int, default=None, help="default: every NQ-open question (3,610)")
    parser.add_argument("--zipf", type=float, default=Shape.zipf)
    parser.add_argument("--l1-mb", type=float, default=None,
                        help="memory per replica in MiB (default: --memory-share of the working set over 3)")
    parser.add_argument("--memory-share", type=float, default=Shape.memory_share,
                        help="total memory of the 3 replicas as a share of the working set")
    parser.add_argument("--near-share", type=float, default=Shape.near_share,
                        help="share of a shared-mode replica's budget kept as its near cache")
    parser.add_argument("--invalidations", type=int, default=None)
    args = parser.parse_args(argv)
    args.invalidations = args.invalidations or (200 if args.quick else 1000)
    args.routing_requests = 2000 if args.quick else 10000
    with redis_server() as url:
        result = asyncio.run(run(args, url))
    _describe(result, "", "long tail (default)")
    _describe(result, "head_heavy_", "head-heavy")
    print(f"invalidation until every replica acknowledged: p50 {result['invalidation_p50_ms']} ms, "
          f"p99 {result['invalidation_p99_ms']} ms (goal p99 <= 100 ms); stale reads after the call: "
          f"{result['stale_reads_after_invalidation']}")
    own, shared = result["routing_prefix_hit_own_boards"], result["routing_prefix_hit_shared_board"]
    print(f"KV prefix tokens reused when routing by prefix summaries: own boards {own:.3f}, shared board {shared:.3f}")
    if args.json:
        print(json.dumps(result))
    return 0
