"""``python -m loadtest.bench policies [--quick] [--json]``: every eviction policy on every trace and
capacity.

For each generated trace (``loadtest.traces``) and each capacity (1%, 5%, 10% of the trace's working set)
every policy replays the same requests (``tiers.policies.simulate.replay``); the figure of merit is the cost-saved
ratio (cost of the hits / cost of all requests). ``bpcache-strict`` is BP-Cache with ``unread_credit=None``
(entries never read in the small queue are always dropped), kept in the table to show what the unread discount
buys.

Also measured, in the same run: replay speed (trace requests per second, each one lookup plus a hit or an
insert, best of a few runs, and the ratio to LRU), and the small-queue ratio sweep of BP-Cache (mean cost
saved per trace over the three capacities). Goals checked: BP-Cache saves >= 10% more cost than LRU on the
one-hit-wonder traces, is never more than 2% (relative) below the best baseline, and replays >= 200k
requests/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from loadtest.traces import (
    GENERATORS,
    ONE_HIT_WONDER_TRACES,
    TraceRecord,
    generate,
    one_hit_fraction,
    working_set_bytes,
)
from tiers.policies import EvictionPolicy, make_policy
from tiers.policies.simulate import replay

BASELINES = ("lru", "fifo", "s3fifo", "gdsf", "landlord")
CANDIDATE = "bpcache"
CAPACITIES = (0.01, 0.05, 0.10)


def _factory(name: str, **options: Any) -> Callable[[int], EvictionPolicy]:
    return lambda capacity: make_policy(name, capacity, **options)


POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    **{name: _factory(name) for name in BASELINES},
    CANDIDATE: _factory(CANDIDATE),
    "bpcache-strict": _factory(CANDIDATE, unread_credit=None),
}


def _label(share: float) -> str:
    return f"{share:.0%}"


def _grid(traces: dict[str, list[TraceRecord]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for trace_name, trace in traces.items():
        working_set = working_set_bytes(trace)
        per_capacity: dict[str, dict[str, dict[str, float]]] = {}
        for share in CAPACITIES:
            capacity = max(1, int(working_set * share))
            per_capacity[_label(share)] = {}
            for name, build in POLICIES.items():
                result = replay(build(capacity), trace)
                per_capacity[_label(share)][name] = {
                    "cost_saved": round(result.cost_saved_ratio, 4),
                    "object_hit": round(result.object_hit_ratio, 4),
                    "byte_hit": round(result.byte_hit_ratio, 4),
                }
        report[trace_name] = {
            "working_set_bytes": working_set,
            "one_hit_fraction": round(one_hit_fraction(trace), 3),
            "cost_saved": {label: {name: cell["cost_saved"] for name, cell in row.items()}
                           for label, row in per_capacity.items()},
            "detail": per_capacity,
        }
    return report


def _speed(trace: list[TraceRecord], repeats: int) -> dict[str, float]:
    capacity = int(working_set_bytes(trace) * 0.05)
    speeds: dict[str, float] = {}
    for name, build in POLICIES.items():
        speeds[name] = round(max(replay(build(capacity), trace).ops_per_second for _ in range(repeats)))
    return speeds


def _sweep(traces: dict[str, list[TraceRecord]], ratios: Sequence[float]) -> dict[str, dict[str, float]]:
    sweep: dict[str, dict[str, float]] = {}
    for ratio in ratios:
        row: dict[str, float] = {}
        for trace_name, trace in traces.items():
            working_set = working_set_bytes(trace)
            row[trace_name] = round(statistics.fmean(
                replay(make_policy(CANDIDATE, max(1, int(working_set * share)), small_ratio=ratio),
                       trace).cost_saved_ratio for share in CAPACITIES), 4)
        row["mean"] = round(statistics.fmean(row.values()), 4)
        sweep[f"{ratio:.2f}"] = row
    return sweep


def _goals(grid: dict[str, Any], speeds: dict[str, float]) -> dict[str, Any]:
    versus_lru: dict[str, float] = {}
    versus_best: dict[str, float] = {}
    for trace_name, entry in grid.items():
        for label, row in entry["cost_saved"].items():
            best = max(row[name] for name in BASELINES)
            versus_best[f"{trace_name}@{label}"] = round(row[CANDIDATE] / best, 4) if best else 1.0
            if trace_name in ONE_HIT_WONDER_TRACES:
                lru = row["lru"]
                versus_lru[f"{trace_name}@{label}"] = round(row[CANDIDATE] / lru, 4) if lru else 0.0
    return {
        "bpcache_over_lru_on_one_hit_wonder": versus_lru,
        "bpcache_over_lru_goal_met": all(ratio >= 1.10 for ratio in versus_lru.values()),
        "bpcache_over_best_baseline": versus_best,
        "bpcache_within_2pct_of_best_goal_met": all(ratio >= 0.98 for ratio in versus_best.values()),
        "bpcache_requests_per_second": speeds[CANDIDATE],
        "bpcache_speed_goal_met": speeds[CANDIDATE] >= 200_000,
    }


def _print_tables(grid: dict[str, Any], speeds: dict[str, float], sweep: dict[str, dict[str, float]],
                  goals: dict[str, Any]) -> None:
    names = list(POLICIES)
    print("cost saved (share of upstream cost avoided), by trace and capacity (% of working set)")
    header = " | ".join(f"{n:>14}" for n in names)
    print(f"| {'trace':<16} | {'cap':>4} | {header} | bp/best | bp/lru |")
    print("|" + "---|" * (len(names) + 4))
    for trace_name, entry in grid.items():
        for label, row in entry["cost_saved"].items():
            best = max(row[n] for n in BASELINES)
            cells = " | ".join(f"{row[n]:>14.4f}" for n in names)
            to_lru = row[CANDIDATE] / row["lru"] if row["lru"] else float("inf")
            title = f"{trace_name} ({entry['one_hit_fraction']:.0%} once)"
            print(f"| {title:<16} | {label:>4} | {cells} | {row[CANDIDATE] / best:7.3f} | {to_lru:6.2f} |")
    print()
    print("replay speed, trace requests per second (ohw80 at 5%; ratio to lru in the same run)")
    for name, speed in speeds.items():
        print(f"  {name:<15} {speed:>10.0f}  x{speed / speeds['lru']:.2f}")
    print()
    print("bpcache small-queue ratio sweep: mean cost saved over 1/5/10% capacity")
    trace_names = [n for n in next(iter(sweep.values())) if n != "mean"]
    print("| ratio | " + " | ".join(f"{n:>8}" for n in trace_names) + " |     mean |")
    for ratio, row in sweep.items():
        cells = " | ".join(f"{row[n]:>8.4f}" for n in trace_names)
        print(f"| {ratio} | {cells} | {row['mean']:>8.4f} |")
    print()
    print(f"goal bpcache >= 1.10 x lru on one-hit-wonder traces: {goals['bpcache_over_lru_goal_met']}")
    print(f"goal bpcache >= 0.98 x best baseline everywhere: {goals['bpcache_within_2pct_of_best_goal_met']} "
          f"(worst {min(goals['bpcache_over_best_baseline'].values()):.3f})")
    print(f"goal bpcache >= 200k requests/s: {goals['bpcache_speed_goal_met']}")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench policies")
    parser.add_argument("--quick", action="store_true", help="short traces (< 60 s)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--requests", type=int, help="requests per trace (default 12k quick, 100k full)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(list(argv))
    requests = args.requests or (12_000 if args.quick else 100_000)
    ratios = (0.02, 0.10, 0.15, 0.20, 0.25) if args.quick else (0.0, 0.01, 0.02, 0.05, 0.10, 0.15, 0.20, 0.25)
    started = time.perf_counter()
    traces = {name: generate(name, requests, args.seed) for name in GENERATORS}
    grid = _grid(traces)
    speeds = _speed(traces["ohw80"], repeats=2 if args.quick else 3)
    sweep = _sweep(traces, ratios)
    goals = _goals(grid, speeds)
    _print_tables(grid, speeds, sweep, goals)
    seconds = time.perf_counter() - started
    print(f"({requests} requests per trace, seed {args.seed}, {seconds:.1f} s)")
    if args.json:
        print(json.dumps({"benchmark": "policies", "requests_per_trace": requests, "seed": args.seed,
                          "traces": grid, "requests_per_second": speeds, "small_ratio_sweep": sweep,
                          "goals": goals, "seconds": round(seconds, 1)}))
    return 0
