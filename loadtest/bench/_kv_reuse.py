"""Where the kv benchmarks' prefix reuse goes: the ceiling of a perfect prefix cache on a workload, the losses
between it and what the servers reported, and the figures of a phase (TTFT, reuse, prefill share; see
:mod:`loadtest.bench.kv`)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtest.bench._kv_workload import Workload
from loadtest.goodput import Outcome
from normalizer.documents import render_document
from normalizer.prompt_plan import Segment


def prefix_reuse_ceiling(work: Workload, first: int = 0, chars_per_token: float = 4.0) -> float:
    """Token reuse of a perfect prefix cache on ``work`` over its requests from index ``first`` on
    (:func:`ceiling_tokens`, summed)."""
    counted = ceiling_tokens(work, chars_per_token)[first:]
    total = sum(t for _, t in counted)
    return sum(c for c, _ in counted) / total if total else 0.0


def ceiling_tokens(work: Workload, chars_per_token: float = 4.0) -> list[tuple[int, int]]:
    """``(cached, prompt)`` estimated tokens of every request of ``work`` under a perfect prefix cache.

    The cache holds every prompt sent before, without limit; each request takes, among the orders the ``reuse``
    policy allows (top-ranked document first or last, the others in any order), the one whose longest cached
    prefix is longest. Prompt = system prompt, documents, question; the question is never reused. Sizes are
    estimated tokens (UTF-8 bytes / ``chars_per_token``), so the figure is comparable with, not equal to, the
    server-reported ``prefix_token_reuse``.
    """

    def size(text: str) -> int:
        return max(1, math.ceil(len(text.encode("utf-8")) / chars_per_token))

    system = size(work.system)
    doc_tokens = [size(render_document(d)) for d in work.documents]
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, int]] = []
    for index, (chosen, question) in enumerate(work.requests):
        top, rest = chosen[0], chosen[1:]
        orders = [(top, *p) for p in itertools.permutations(rest)] + [(*p, top) for p in itertools.permutations(rest)]
        best_order, best = orders[0], -1
        for order in orders:
            reused = system if index else 0  # the system prompt is cached from the second request on
            for depth in range(1, len(order) + 1):
                if order[:depth] not in seen:
                    break
                reused += doc_tokens[order[depth - 1]]
            if reused > best:
                best_order, best = order, reused
        seen.update(best_order[:depth] for depth in range(1, len(best_order) + 1))
        out.append((best, system + sum(doc_tokens[d] for d in chosen) + size(question)))
    return out


@dataclass(frozen=True, slots=True)
class Routed:
    """One answered request of a proxy side, in the knowledge tree's estimated tokens: the workload's request
    ``index``, the order it was routed in (``ticket``), its ``replica`` and prefix ``path``, the prompt's
    ``total``, the reuse ``predicted`` (the tree's, or the chosen slot's) and the ``reported`` one."""

    index: int
    ticket: int
    replica: int
    path: tuple[Segment, ...]
    total: int
    predicted: int
    reported: int


def reuse_losses(routed: Sequence[Routed], first: int, ceiling: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Where reuse goes, as shares of the prompt tokens of the answered requests from workload index ``first``
    on: ``ceiling`` (a perfect prefix cache, best order), ``one_cache`` (the longest prefix of the path as the
    proxy sent it among every path it sent before, to any replica), ``same_replica`` (among those sent to the
    same replica), ``predicted`` and ``reported``. The steps between them are the order chosen, the history split
    across replicas, what the servers lost or the tree forgot, and the prediction's error."""
    seen: set[tuple[str, ...]] = set()
    seen_by: dict[int, set[tuple[str, ...]]] = {}
    sums = dict.fromkeys(["ceiling", "one_cache", "same_replica", "predicted", "reported"], 0)
    total = 0

    def longest(path: tuple[Segment, ...], prefixes: set[tuple[str, ...]]) -> int:
        keys = tuple(segment.key for segment in path)
        tokens = 0
        for depth, segment in enumerate(path, 1):
            if keys[:depth] not in prefixes:
                break
            tokens += segment.tokens
        return tokens

    for r in sorted(routed, key=lambda r: r.ticket):
        replica_seen = seen_by.setdefault(r.replica, set())
        if r.index >= first:
            cached, prompt = ceiling[r.index]
            sums["ceiling"] += round(cached * r.total / prompt) if prompt else 0
            sums["one_cache"] += longest(r.path, seen)
            sums["same_replica"] += longest(r.path, replica_seen)
            sums["predicted"] += r.predicted
            sums["reported"] += r.reported
            total += r.total
        keys = tuple(segment.key for segment in r.path)
        prefixes = {keys[:depth] for depth in range(1, len(keys) + 1)}
        seen |= prefixes
        replica_seen |= prefixes
    return {name: round(value / total, 3) if total else 0.0 for name, value in sums.items()}


def reuse_share(samples: list[Outcome]) -> float:
    cached = sum(s.cache_n for s in samples)
    total = cached + sum(s.prompt_n for s in samples)
    return cached / total if total else 0.0


def prefill_share(samples: list[Outcome]) -> float:
    total_ms = sum(s.ttft_s for s in samples) * 1000
    return sum(s.prompt_ms for s in samples) / total_ms if total_ms else 0.0


@dataclass(slots=True)
class Phase:
    direct: list[Outcome]
    proxy: list[Outcome]
    others: dict[str, list[Outcome]] = field(default_factory=dict)
    """The further sides (``smg``, ``preserve``), by name."""

    def sides(self) -> dict[str, list[Outcome]]:
        """Every side's outcomes, by name (``direct``, ``proxy``, then the others)."""
        return {"direct": self.direct, "proxy": self.proxy, **self.others}

    def summary(self) -> dict[str, float]:
        p50_direct = statistics.median(s.ttft_s for s in self.direct) * 1000
        p50_proxy = statistics.median(s.ttft_s for s in self.proxy) * 1000
        figures = {
            "ttft_p50_direct_ms": round(p50_direct, 1),
            "ttft_p50_proxy_ms": round(p50_proxy, 1),
            "ttft_mean_direct_ms": round(statistics.mean(s.ttft_s for s in self.direct) * 1000, 1),
            "ttft_mean_proxy_ms": round(statistics.mean(s.ttft_s for s in self.proxy) * 1000, 1),
            "ttft_speedup": round(p50_direct / p50_proxy, 2),
            "prefix_token_reuse": round(reuse_share(self.proxy), 3),
            "prefix_token_reuse_direct": round(reuse_share(self.direct), 3),
            "prefill_share": round(prefill_share(self.proxy), 3),
            "prefill_share_direct": round(prefill_share(self.direct), 3),
            "prompt_ms_mean": round(statistics.mean(s.prompt_ms for s in self.proxy), 1),
            "prompt_ms_mean_direct": round(statistics.mean(s.prompt_ms for s in self.direct), 1),
        }
        for name, samples in self.others.items():
            p50 = statistics.median(s.ttft_s for s in samples) * 1000
            figures[f"ttft_p50_{name}_ms"] = round(p50, 1)
            figures[f"ttft_speedup_vs_{name}"] = round(p50 / p50_proxy, 2)
            figures[f"prefix_token_reuse_{name}"] = round(reuse_share(samples), 3)
            figures[f"prefill_share_{name}"] = round(prefill_share(samples), 3)
        return figures


def prefill_bound_speedup(phase: Phase) -> float:
    """The TTFT speedup the proxy's saved prefill allows: mean direct TTFT over (mean direct TTFT minus the prefill
    time the proxy saved per request) — what a perfect proxy that only cut prefill could give on this phase."""
    direct_ttft = statistics.mean(s.ttft_s for s in phase.direct) * 1000
    saved = statistics.mean(s.prompt_ms for s in phase.direct) - statistics.mean(s.prompt_ms for s in phase.proxy)
    return direct_ttft / (direct_ttft - saved) if direct_ttft > saved else math.inf
