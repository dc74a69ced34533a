"""Discrete-event simulation of a RAG workload against N replicas with prefix KV caches, under four routers.

Replica model (self-contained so that benchmarks do not depend on tests/): a prefix cache over prompt segments
— each prefix of a prompt path (system prompt, documents, question) is one entry sized in tokens, LRU-evicted
within ``kv_capacity_tokens``; after a prefill the path's prefixes are touched last-to-first so parents
outlive children (as vLLM frees blocks). One prefill at a time per replica; prefill time is ``fixed +
per_token * uncached`` evaluated with what is cached when the prefill starts. Decode is not modelled: the
metric is time to first token.

Workload: Poisson arrivals; each request picks one of ``apps`` system prompts, ``k`` in [3, 5] documents drawn
without replacement from a Zipf(``zipf_s``) popularity over the corpus, in a random (retrieval) order, and a
fresh question.

Routers compared:

* ``round_robin`` — request i goes to replica i mod N, documents in retrieval order;
* ``least_loaded`` — fewest requests queued or in prefill;
* ``prefix_hash`` — hash of (system prompt, first document) mod N, the usual sticky prefix routing;
* ``ragproxy`` — :mod:`proxy.kv`: knowledge tree per replica, ``reuse`` document order, router by estimated
  TTFT with the load-balance guard, SLO refusal and SLO-headroom affinity, cache-aware waiting queue that drops
  (refuses) a request once it can no longer start in time, tree correction and prefill-model refit from what
  the replica reports.

SLO attainment = share of the measured requests answered with TTFT within the SLO (refused requests count as
misses). Goodput (as in DistServe) = the highest request rate at which attainment stays at or above a target
(90%), found by :func:`max_goodput_load` with bisection over the offered load.

``warmup`` requests (default none) arrive first, at the same rate, and are not counted: with them the figures
describe a proxy and backends that have been running, not the first minutes after a cold start of every cache.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from normalizer.prompt_plan import Segment
from proxy.kv.admission_queue import CacheAwareOrder
from proxy.kv.order import OrderPolicy, Popularity, order_documents
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Candidate, Reject, Router
from proxy.kv.tree import KnowledgeTree, Match

ROUTERS = ("round_robin", "least_loaded", "prefix_hash", "ragproxy")


@dataclass(frozen=True, slots=True)
class SimConfig:
    replicas: int = 8
    requests: int = 4000
    load: float = 1.3
    """Offered load as a multiple of what the replicas could serve with no cache at all."""
    corpus: int = 4000
    zipf_s: float = 1.1
    apps: int = 4
    system_tokens: int = 300
    doc_tokens: tuple[int, int] = (300, 700)
    question_tokens: int = 40
    kv_capacity_tokens: int = 60_000
    fixed_s: float = 0.02
    per_token_s: float = 0.0002
    ttft_slo_s: float = 1.5
    seed: int = 7
    warmup: int = 0
    """Requests sent before the measured ones and not counted."""
    foresee_queue: bool = True
    """``ragproxy`` refuses at arrival what its waiting queue's order says cannot start in time; ``False``: only what
    could not at the head of the queue (the rule before, :mod:`proxy.kv.router`)."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    arrival: float
    system: Segment
    documents: tuple[Segment, ...]
    question: Segment

    @property
    def total_tokens(self) -> int:
        return self.system.tokens + sum(d.tokens for d in self.documents) + self.question.tokens


def request_rate(config: SimConfig) -> float:
    """Requests per second offered at ``config.load`` (load 1 = what the replicas serve with no cache)."""
    mean_tokens = config.system_tokens + 4 * sum(config.doc_tokens) / 2 + config.question_tokens
    cold_s = config.fixed_s + config.per_token_s * mean_tokens
    return config.load * config.replicas / cold_s


def workload(config: SimConfig) -> list[SimRequest]:
    """The requests (warm-up first); the same seed gives the same requests at any load, only their arrival
    times scale."""
    rnd = random.Random(config.seed)
    docs = [Segment(f"d{i}", rnd.randint(*config.doc_tokens)) for i in range(config.corpus)]
    weights = [1.0 / (rank + 1) ** config.zipf_s for rank in range(config.corpus)]
    systems = [Segment(f"s{i}", config.system_tokens) for i in range(config.apps)]
    rate = request_rate(config)
    now = 0.0
    requests = []
    for i in range(config.warmup + config.requests):
        now += rnd.expovariate(rate)
        k = rnd.randint(3, 5)
        chosen: list[Segment] = []
        while len(chosen) < k:
            doc = rnd.choices(docs, weights)[0]
            if doc not in chosen:
                chosen.append(doc)
        rnd.shuffle(chosen)
        requests.append(
            SimRequest(i, now, rnd.choice(systems), tuple(chosen), Segment(f"q{i}", config.question_tokens))
        )
    return requests


class PrefixCache:
    """What one simulated replica holds: prompt prefixes with LRU eviction by tokens."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._entries: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self.size = 0

    def cached_tokens(self, path: list[Segment]) -> int:
        tokens = 0
        for i in range(1, len(path) + 1):
            if tuple(s.key for s in path[:i]) not in self._entries:
                break
            tokens += path[i - 1].tokens
        return min(tokens, sum(s.tokens for s in path) - 1)

    def insert(self, path: list[Segment]) -> None:
        for i in range(len(path), 0, -1):
            key = tuple(s.key for s in path[:i])
            if key in self._entries:
                self._entries.move_to_end(key)
            else:
                self._entries[key] = path[i - 1].tokens
                self.size += path[i - 1].tokens
        while self.size > self.capacity_tokens and self._entries:
            _, tokens = self._entries.popitem(last=False)
            self.size -= tokens


@dataclass
class _Queued:
    request: SimRequest
    path: list[Segment]
    predicted: Match | None = None


@dataclass
class _Replica:
    cache: PrefixCache
    fifo: deque[_Queued] = field(default_factory=deque)
    ordered: CacheAwareOrder[_Queued] | None = None
    busy: bool = False

    def waiting(self) -> int:
        return len(self.ordered) if self.ordered is not None else len(self.fifo)


@dataclass(frozen=True, slots=True)
class SimResult:
    router: str
    replicas: int
    completed: int
    rejected: int
    """Refused, at arrival or after waiting (the two below)."""
    refused_on_arrival: int
    refused_waiting: int
    good: int
    duration_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    cached_fraction: float

    @property
    def goodput(self) -> float:
        return self.good / self.duration_s if self.duration_s else 0.0

    @property
    def attainment(self) -> float:
        """Share of all requests (refused ones included) answered within the SLO."""
        total = self.completed + self.rejected
        return self.good / total if total else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(config: SimConfig, router_name: str, requests: list[SimRequest] | None = None) -> SimResult:
    """Run one router over the workload; returns its figures."""
    requests = requests if requests is not None else workload(config)
    now = 0.0
    clock: Callable[[], float] = lambda: now  # noqa: E731
    truth = PrefillModel(PrefillCoefficients(config.fixed_s, config.per_token_s, 0.0))
    use_kv = router_name == "ragproxy"
    window = config.ttft_slo_s  # the waiting queues' starvation window
    replicas = [
        _Replica(
            PrefixCache(config.kv_capacity_tokens),
            ordered=CacheAwareOrder(starvation_window_s=window) if use_kv else None,
        )
        for _ in range(config.replicas)
    ]
    models = [PrefillModel(min_observations=16) for _ in range(config.replicas)]
    trees = [KnowledgeTree(config.kv_capacity_tokens, prefill=m, clock=clock) for m in models]
    router = Router(models, ttft_slo_s=config.ttft_slo_s, starvation_window_s=window if config.foresee_queue else None,
                    clock=clock)
    popularity = Popularity()
    events: list[tuple[float, int, int, object]] = []
    tie = itertools.count()
    for request in requests:
        heapq.heappush(events, (request.arrival, next(tie), 0, request))
    ttfts: list[float] = []
    rejected = waiting_refused = 0
    cached_total = 0
    prompt_total = 0
    rr = itertools.count()

    def start(index: int) -> None:
        nonlocal rejected, waiting_refused
        replica = replicas[index]
        if replica.busy:
            return
        item = (
            replica.ordered.pop(now)
            if replica.ordered is not None
            else (replica.fifo.popleft() if replica.fifo else None)
        )
        if replica.ordered is not None:
            for late in replica.ordered.expired:  # can no longer start in time: refused (429)
                rejected += late.request.index >= config.warmup
                waiting_refused += late.request.index >= config.warmup
                router.finished(str(late.request.index), index)
                assert late.predicted is not None
                trees[index].retract(late.path[:-1], late.predicted)
            replica.ordered.expired.clear()
        if item is None:
            return
        replica.busy = True
        cached = replica.cache.cached_tokens(item.path)
        uncached = item.request.total_tokens - cached
        duration = truth.seconds(uncached, cached)
        if use_kv:
            router.started(str(item.request.index), index)
        heapq.heappush(events, (now + duration, next(tie), 1, (index, item, cached, uncached, duration)))

    for time, _, kind, payload in iter(lambda: heapq.heappop(events) if events else None, None):
        now = time
        if kind == 0:
            assert isinstance(payload, SimRequest)
            request = payload
            documents = list(request.documents)
            if router_name == "round_robin":
                target = next(rr) % config.replicas
            elif router_name == "least_loaded":
                target = min(
                    range(config.replicas), key=lambda i: (replicas[i].waiting() + replicas[i].busy, i)
                )
            elif router_name == "prefix_hash":
                digest = hashlib.blake2b(f"{request.system.key}|{documents[0].key}".encode(), digest_size=8)
                target = int.from_bytes(digest.digest(), "big") % config.replicas
            else:
                popularity.observe([d.key for d in documents])
                orders = [
                    order_documents(OrderPolicy.REUSE, request.system, documents, t, popularity=popularity)
                    for t in trees
                ]
                candidates = [
                    Candidate(i, trees[i].match([request.system, *orders[i]]).tokens, request.total_tokens)
                    for i in range(config.replicas)
                ]
                decision = router.choose(candidates)
                if isinstance(decision, Reject):
                    rejected += request.index >= config.warmup
                    continue
                target = decision.replica
                documents = orders[target]
                path = [request.system, *documents]
                predicted = trees[target].insert(path)
                router.admitted(str(request.index), decision)
                item = _Queued(request, [*path, request.question], predicted)
                queue = replicas[target].ordered
                assert queue is not None
                compute = max(1, decision.uncached_tokens)
                queue.push(item, decision.cached_tokens, compute, now, decision.start_deadline)
                start(target)
                continue
            replicas[target].fifo.append(_Queued(request, [request.system, *documents, request.question]))
            start(target)
        else:
            assert isinstance(payload, tuple)
            index, item, cached, uncached, duration = payload
            replica = replicas[index]
            replica.cache.insert(item.path)
            replica.busy = False
            if item.request.index >= config.warmup:
                ttfts.append(now - item.request.arrival)
                cached_total += cached
                prompt_total += item.request.total_tokens
            if use_kv:
                key = str(item.request.index)
                first = router.first_token(key, index)
                router.finished(key, index)
                if first is not None:
                    router.measured(first, uncached, cached)
                trees[index].correct(item.path[:-1], cached, item.predicted)
                models[index].observe(uncached, cached, duration)
            start(index)
    measured_from = requests[config.warmup].arrival if config.warmup < len(requests) else 0.0
    duration_s = max(now, requests[-1].arrival) - measured_from if requests else 0.0
    good = sum(1 for t in ttfts if t <= config.ttft_slo_s)
    return SimResult(
        router=router_name,
        replicas=config.replicas,
        completed=len(ttfts),
        rejected=rejected,
        refused_on_arrival=rejected - waiting_refused,
        refused_waiting=waiting_refused,
        good=good,
        duration_s=duration_s,
        ttft_p50_s=_percentile(ttfts, 0.5),
        ttft_p99_s=_percentile(ttfts, 0.99),
        cached_fraction=cached_total / prompt_total if prompt_total else 0.0,
    )


def max_goodput_load(
    config: SimConfig,
    router_name: str,
    *,
    target: float = 0.9,
    low: float = 0.5,
    high: float = 2.5,
    steps: int = 5,
) -> tuple[float, dict[float, float]]:
    """Highest load (multiple of cache-less capacity) whose SLO attainment is at least ``target``.

    Returns it (0 when even ``low`` misses) and the attainment measured at each load tried.
    """
    tried: dict[float, float] = {}

    def attainment(load: float) -> float:
        result = simulate(replace(config, load=load), router_name).attainment
        tried[round(load, 4)] = result
        return result

    if attainment(low) < target:
        return 0.0, tried
    if attainment(high) >= target:
        return high, tried
    for _ in range(steps):
        middle = (low + high) / 2
        if attainment(middle) >= target:
            low = middle
        else:
            high = middle
    return low, tried
