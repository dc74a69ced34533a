"""Replay a cache trace through an eviction policy and report object, byte and cost hit ratios.

``ragproxy simulate TRACE [--policy NAME|all ...] [--capacity 5% | BYTES ...] [--json]``

TRACE is a JSON-lines file (``{key, size, cost, time}`` per line, :mod:`tiers.policies.trace`, e.g. recorded by the
proxy with ``cache.trace_file``). A capacity ending in ``%`` is a share of the trace's working set (bytes of all
distinct keys). Replay semantics, the same for every policy: a request whose key is resident is a hit
(``policy.hit``); any other request is a miss that offers the entry to the policy (``policy.insert``). Ratios:
object hit = hits / requests; byte hit = bytes served from cache / bytes requested; cost saved = cost of the hits /
cost of all requests (the share of upstream cost the cache avoided).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tiers.policies import POLICY_NAMES, EvictionPolicy, make_policy
from tiers.policies.trace import TraceRecord, read_trace, working_set_bytes

Generator = Callable[[int, int], Iterable[TraceRecord]]
"""A synthetic trace: ``(requests, seed)`` → records."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one policy achieved on one trace at one capacity."""

    policy: str
    capacity: int
    requests: int
    hits: int
    object_hit_ratio: float
    byte_hit_ratio: float
    cost_saved_ratio: float
    seconds: float

    @property
    def ops_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("inf")


def replay(policy: EvictionPolicy, trace: Sequence[TraceRecord]) -> ReplayResult:
    """Feed every request of ``trace`` to ``policy`` and count what it would have served."""
    hits = hit_bytes = 0
    hit_cost = 0.0
    contains, on_hit, on_miss = policy.__contains__, policy.hit, policy.insert
    started = time.perf_counter()
    for request in trace:
        key = request.key
        if contains(key):
            on_hit(key)
            hits += 1
            hit_bytes += request.size
            hit_cost += request.cost
        else:
            on_miss(key, request.size, request.cost)
    seconds = time.perf_counter() - started
    total_bytes = sum(request.size for request in trace)
    total_cost = sum(request.cost for request in trace)
    return ReplayResult(
        policy=policy.name,
        capacity=policy.capacity,
        requests=len(trace),
        hits=hits,
        object_hit_ratio=hits / len(trace) if trace else 0.0,
        byte_hit_ratio=hit_bytes / total_bytes if total_bytes else 0.0,
        cost_saved_ratio=hit_cost / total_cost if total_cost else 0.0,
        seconds=seconds,
    )


def parse_capacity(text: str, working_set: int) -> int:
    """``"5%"`` -> 5% of ``working_set`` bytes; ``"1048576"`` -> that many bytes."""
    text = text.strip()
    if text.endswith("%"):
        return max(1, int(working_set * float(text[:-1]) / 100))
    capacity = int(text)
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
    return capacity


def load_trace(source: str, requests: int, seed: int, generators: Mapping[str, Generator]) -> list[TraceRecord]:
    """A trace file's records, or a generated trace when ``source`` names a generator and is not a file."""
    if Path(source).is_file():
        return list(read_trace(source))
    if source in generators:
        return list(generators[source](requests, seed))
    named = f" nor a generator ({', '.join(generators)})" if generators else ""
    raise ValueError(f"{source!r} is not a trace file{named}")


def _arguments(argv: Sequence[str], generators: Mapping[str, Generator]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ragproxy simulate", description=__doc__.splitlines()[0])
    names = f" or generator name ({', '.join(generators)})" if generators else ""
    parser.add_argument("trace", help=f"JSONL trace file (cache.trace_file){names}")
    parser.add_argument("--policy", action="append", help=f"one of {', '.join(POLICY_NAMES)} or 'all' "
                        "(repeatable; default all)")
    parser.add_argument("--capacity", action="append", help="bytes or a %% of the working set (repeatable; "
                        "default 1%%, 5%%, 10%%)")
    parser.add_argument("--requests", type=int, default=100_000, help="requests to generate (generators)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (generators only)")
    parser.add_argument("--small-ratio", type=float, help="small-queue share for s3fifo and bpcache")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None, generators: Mapping[str, Generator] | None = None) -> int:
    """The command line; ``generators`` adds named synthetic traces (``python -m loadtest.simulate``)."""
    import sys

    generators = generators or {}
    args = _arguments(sys.argv[1:] if argv is None else argv, generators)
    policies = [name for choice in (args.policy or ["all"])
                for name in (POLICY_NAMES if choice == "all" else [choice])]
    unknown = [name for name in policies if name not in POLICY_NAMES]
    try:
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r}; allowed: {', '.join(POLICY_NAMES)}, all")
        trace = load_trace(args.trace, args.requests, args.seed, generators)
        working_set = working_set_bytes(trace)
        capacities = [parse_capacity(text, working_set) for text in (args.capacity or ["1%", "5%", "10%"])]
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    print(f"trace {args.trace}: {len(trace)} requests, working set {working_set} bytes")
    print(f"{'policy':<10} {'capacity':>12} {'object hit':>10} {'byte hit':>9} {'cost saved':>10} "
          f"{'ops/s':>10}")
    results: list[ReplayResult] = []
    for capacity in capacities:
        for name in policies:
            options = {"small_ratio": args.small_ratio} if args.small_ratio is not None and name in (
                "s3fifo", "bpcache") else {}
            result = replay(make_policy(name, capacity, **options), trace)
            results.append(result)
            print(f"{name:<10} {capacity:>12} {result.object_hit_ratio:>10.4f} {result.byte_hit_ratio:>9.4f} "
                  f"{result.cost_saved_ratio:>10.4f} {result.ops_per_second:>10.0f}")
    if args.json:
        print(json.dumps({"trace": args.trace, "requests": len(trace), "working_set_bytes": working_set,
                          "results": [asdict(result) for result in results]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
