"""KV-aware routing: pick the replica with the lowest estimated time to first token, or refuse.

For each replica the caller gives how many of the request's prompt tokens that replica probably has cached
(knowledge tree) and the prompt's total. The estimate (Mooncake's conductor) is::

    ttft = queue wait + prefill(uncached tokens behind the cached ones)

where the queue wait is the prefill work still ahead on that replica — the remaining estimated prefill of the
requests it is running (their estimate minus the time since they started, never below zero) plus the estimated
prefill of the requests waiting for a concurrency slot — divided by ``parallelism`` (how many prefills the
replica overlaps). It is 1 by default, and right for llama.cpp whatever its slots: its server fills each batch
with the prompt tokens of its slots in slot order (``update_slots`` in ``tools/server/server-context.cpp``), so
the prompts of several slots are computed one after the other, not side by side; counting its slots as
parallelism halved the estimated wait on a 2-slot server and let the proxy admit requests that could not meet
the objective (``python -m loadtest.bench kv_load``).

A prefill that overlapped another on the same replica was slowed by it, so its reported time says little about
the prefill alone: :meth:`Router.first_token` says whether the request's prefill ran alone, and only those are fed
to the prefill model (:class:`~proxy.kv.stages.Route`).

Slowdown: what the prefill models cannot see — replicas or other work sharing the same GPU or CPU cores, a
machine busier than when the models were fitted, the server's own per-request work — makes the estimates wrong by
a common factor. The router keeps one :class:`Slowdown` for its replicas: the measured over the estimated time
from a request's start to its first token, the estimate made again with the tokens the backend reports it
computed and reused (:meth:`Router.measured`: a wrong guess of what was cached is the knowledge tree's to
correct, not slowness; counted as slowness, it cost the routing simulation 0.1 of its goodput ratio with 8
replicas), as a geometric moving average (weight 0.2 per request, within ``[1/4, 8]``), which multiplies the
prefill of every new estimate. It relaxes towards 1 with a half-life of 10 s while no replica is busy, so
estimates that refuse everything do not stay. One factor, not one per replica: a per-replica factor relaxed on
the idle replica and stayed up on the busy one, so the router drifted to the replica with less cached for it (in
the sequential ``kv`` bench, reuse fell from 0.52 to 0.49); replicas that differ in speed differ in their own
prefill fits. On the shared 2-core machine of the load benchmark, estimates without it were half the measured
times under load, and the least-work rule kept sending to one replica while the other idled.

Load-balance guard (the rule of SGLang's cache-aware router): when replicas are imbalanced — the busiest has
more than ``balance_abs_threshold`` requests above the idlest and more than ``balance_rel_threshold`` times as
many — cache affinity is ignored and the least-loaded replica (by outstanding requests, then estimate) is
chosen, so a hot prefix cannot pile everything onto one replica.

Refusal at arrival: with ``ttft_slo_s`` set, a replica is a candidate only where the request is expected to start
its prefill by its start deadline (the SLO less its own prefill): the router foresees its waiting queue
(:func:`~proxy.kv.expected_start.expected_start`) — the prefill in hand, then the cache-aware order of
:class:`~proxy.kv.admission_queue.CacheAwareOrder` over the requests waiting there and the newcomer (better ``cached
/ compute`` ratio first; an entry past ``starvation_window_s`` first of all), where those waiting whose own deadline
passes before their turn are dropped and count for nothing, and where later arrivals with a better ratio go first
until the newcomer has waited the window, at half the rate such requests were admitted there over the last SLO
(:meth:`ReplicaLoad.overtaking`, :data:`OVERTAKING_SHARE`). When no replica is expected to start it in time, the
router answers :class:`Reject` with a ``retry_after_s`` (the best expected time to first token's excess over the
SLO, rounded up to whole seconds, at least one); the Route stage turns that into 429 with ``Retry-After``. The queue
still drops (429) a request whose deadline passes while it waits: the backstop for what the foresight missed
(estimates off, arrivals above the expected rate).

Why this rule and not the two before it: the plain estimate (everything waiting ahead, then this request) counts
work that will not run before it — requests with less cached go after it, doomed ones are dropped — and refused
requests that would have made it: at the direct side's knee in ``kv_load``, 11% refused where the direct side
answered 98% in time. Refusing only what could not start in time even at the head of its queue admitted everything
the queue then dropped after a wait: in the routing simulation (``python -m loadtest.bench routing --quick
--overload 2.5``; ``--arrival-rule head`` for the rule before; BENCHMARKS.md) at 2.5 times the cache-less capacity
all of its 29.5% refusals (4 replicas) came after waiting. There the queue's replay alone refused nothing at
arrival: what drops a request is the better-placed requests that arrive while it waits. Later arrivals are a rate,
not known requests, and a wrong refusal costs an answer while a late drop costs the client a wait shorter than the
SLO, so the foresight takes half the recent rate (:data:`OVERTAKING_SHARE`): with the whole rate, 72% of the
refusals came at arrival and the share in time at 2.5 rose from 0.70 to 0.74, but at the 4-replica knee requests
that would have made it were refused (the highest load with 90% in time 1.75 against 1.81 times the cache-less
capacity); with half, that load is what it was (1.81 and 1.94 with 4 and 8 replicas), the share in time at 2.5 rose
to 0.72 and 0.74 (from 0.70 and 0.71), and 8.2% and 3.6% are refused at arrival (of 27.8% and 25.5%), the rest after
waiting. ``starvation_window_s=None`` keeps the rule before (only what misses at the head of its queue is refused).

With an SLO, a first token sooner than the SLO earns nothing, while every token a replica computes is capacity
taken from the requests behind it. So among the replicas whose estimate is within ``affinity_headroom`` times
the SLO, the router takes the one with the least prefill work (the most cached prefix), ties by estimate; only
when none is that comfortable does the lowest estimate decide. The headroom (default 0.7) leaves 30% of the SLO
for what the estimate cannot see: requests queued later that the cache-aware queue lets go first, and the
estimate's own error. In the routing simulation (``python -m loadtest.bench routing``) this raised goodput by
2-5% over lowest-estimate routing. Each decision also carries ``start_deadline``, the latest time its prefill
can start and still end within the SLO; the admission queue drops the request (429) once that has passed.

With one replica and no SLO the router has nothing to compare and nothing to refuse: it keeps no load
bookkeeping then (:attr:`Router.tracks_load`), and its estimate is the prefill alone. A pass-through proxy in front
of a single backend pays nothing for routing it does not do.

Pure: the caller tells the router when requests are admitted, start and finish; the clock is injected.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from proxy.kv.expected_start import Waiting, expected_start
from proxy.kv.prefill import PrefillModel
from proxy.kv.settings import RoutingSettings

_ROUTING = RoutingSettings()  # the defaults, defined once there

OVERTAKING_SHARE = 0.5
"""Share of the recent rate of better-placed admissions that the arrival test expects to overtake a newcomer
(module docs: the whole rate refused requests that would have made it)."""


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class Candidate:
    """One replica's view of a request: tokens it probably has cached, and the prompt's total."""

    replica: int
    cached_tokens: int
    total_tokens: int


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class RouteDecision:
    replica: int
    estimated_ttft_s: float
    cached_tokens: int
    uncached_tokens: int
    prefill_s: float
    reason: str
    """``"ttft"`` (lowest estimate), ``"affinity"`` (least work within the SLO headroom) or ``"balance"``
    (load-balance guard)."""
    start_deadline: float | None = None
    """Router clock time after which the prefill can no longer end within the SLO (``None`` without one)."""


@dataclass(frozen=True, slots=True)
class Reject:
    retry_after_s: int
    best_estimate_s: float


@dataclass(slots=True)
class _Outstanding:
    prefill_s: float
    waiting: Waiting | None = None
    """Its place in the waiting queue's order (ratio, admission time, deadline), for :func:`expected_start`."""
    end: float | None = None
    """Started: when its estimated prefill ends (router clock); counted in the running sums until then."""
    alone: bool = False
    """Started while no other prefill of the replica was running."""
    starts_before: int = 0
    """The replica's count of started prefills when this one started (a later start overlapped it)."""
    started_at: float = 0.0
    ahead_s: float = 0.0
    """At its start: the estimated prefill left ahead of it on the replica."""
    factor: float = 1.0
    """At its start: the slowdown its estimates carried."""


@dataclass(frozen=True, slots=True)
class FirstToken:
    """A started request at its first token (:meth:`Router.first_token`): whether its prefill ran alone on its
    replica, and what :meth:`Router.measured` needs to learn the slowdown once the backend says what it computed."""

    replica: int
    alone: bool
    ahead_s: float
    factor: float
    elapsed_s: float
    """From its start to its first token (or to the whole reply, for one that was not streamed)."""


@dataclass(slots=True)
class Slowdown:
    """Measured over estimated time to first token, averaged over the requests of all replicas (module docs)."""

    value: float = 1.0
    weight: float = 0.2
    half_life_s: float = 10.0
    running: int = 0
    """Requests started and not past their first token, on any replica."""
    idle_since: float = 0.0

    def factor(self, now: float) -> float:
        """The slowdown to apply now: ``value``, relaxed towards 1 for as long as every replica has been idle."""
        if self.running or self.value == 1.0:
            return self.value
        decay = math.pow(0.5, max(0.0, now - self.idle_since) / self.half_life_s)
        return 1.0 + (self.value - 1.0) * decay

    def started(self, now: float) -> None:
        if not self.running:  # busy again: what relaxed while idle stands
            self.value = self.factor(now)
        self.running += 1

    def ended(self, now: float) -> None:
        """A started request is past its first token (or gone)."""
        self.running = max(0, self.running - 1)
        if not self.running:
            self.idle_since = now

    def measure(self, expected_s: float, measured_s: float) -> None:
        """A first token expected ``expected_s`` after its start (with the factor of that time) took ``measured_s``."""
        if expected_s > 0 and measured_s > 0:  # the ratio is what the factor of that time left to correct
            self.value = min(8.0, max(0.25, self.value * math.pow(measured_s / expected_s, self.weight)))


@dataclass(slots=True)
class ReplicaLoad:
    """Work admitted to one replica and not yet past its first token.

    :meth:`wait_s` is O(1) amortized, as it runs for every candidate of every request: the prefill of requests
    not started is one running sum; the started ones are a heap of estimated end times with the sum and count of
    those not yet ended (``Σ max(0, end - now)`` over them is ``sum - count·now``).
    """

    prefill: PrefillModel
    parallelism: int = 1
    outstanding: dict[str, _Outstanding] = field(default_factory=dict)
    active: int = 0
    """Requests admitted and not finished (includes those past their first token)."""
    _unstarted_s: float = 0.0
    _ends: list[tuple[float, int, str]] = field(default_factory=list)
    _ends_sum: float = 0.0
    _ends_live: int = 0
    _tie: int = 0
    _running: int = 0
    """Started and not removed yet (prefill running, by the replica's own clock, whatever the estimate says)."""
    _starts: int = 0
    _recent: deque[Waiting] = field(default_factory=deque)
    """Admissions of the last :attr:`recent_s`, oldest first (:meth:`overtaking`)."""
    recent_s: float = 1.0
    """How far back admissions count (the router's SLO: later ones would start after a newcomer's deadline)."""
    slowdown: Slowdown = field(default_factory=Slowdown)
    """Shared by the replicas of a router."""

    def add(self, request_id: str, prefill_s: float, waiting: Waiting | None = None) -> None:
        self.remove(request_id)
        self.outstanding[request_id] = _Outstanding(prefill_s, waiting)
        self._unstarted_s += prefill_s
        if waiting is not None:
            self._recent.append(waiting)
            self._forget(waiting.enqueued_at)

    def overtaking(self, ratio: float, now: float) -> float:
        """Prefill seconds per second lately admitted with a better ratio than ``ratio`` (they go first in the
        waiting queue)."""
        self._forget(now)
        return sum(w.prefill_s for w in self._recent if w.ratio > ratio) / self.recent_s

    def _forget(self, now: float) -> None:
        recent = self._recent
        while recent and recent[0].enqueued_at < now - self.recent_s:
            recent.popleft()

    def waiting(self) -> list[Waiting]:
        """The requests not started, in admission order (one admitted without a place goes before any newcomer)."""
        return [
            item.waiting or Waiting(item.prefill_s, math.inf, -math.inf, None)
            for item in self.outstanding.values()
            if item.end is None
        ]

    def start(self, request_id: str, now: float) -> None:
        item = self.outstanding.get(request_id)
        if item is None or item.end is not None:
            return
        self._unstarted_s = max(0.0, self._unstarted_s - item.prefill_s)
        self.slowdown.started(now)
        item.ahead_s, item.factor = self.running_s(now), self.slowdown.factor(now)
        item.end = now + item.prefill_s
        item.started_at = now
        item.alone, item.starts_before = self._running == 0, self._starts
        self._running += 1
        self._starts += 1
        self._tie += 1
        heapq.heappush(self._ends, (item.end, self._tie, request_id))
        self._ends_sum += item.end
        self._ends_live += 1
        if len(self._ends) > 2 * self._ends_live + 64:  # entries of removed requests, waiting to expire
            self._ends = [e for e in self._ends if self._counted(e[2], e[0])]
            heapq.heapify(self._ends)

    def remove(self, request_id: str, now: float | None = None) -> FirstToken | None:
        """Forget the request; for one that had started, what it was at ``now`` (its first token, when given):
        whether its prefill ran alone (it started while no other prefill of the replica was running, and no other
        started before this removal), and the slowdown's inputs."""
        item = self.outstanding.pop(request_id, None)
        if item is None:
            return None
        first = None
        if item.end is None:
            self._unstarted_s = max(0.0, self._unstarted_s - item.prefill_s)
        else:
            at = item.started_at if now is None else now
            self.slowdown.ended(at)
            self._running -= 1
            alone = item.alone and self._starts == item.starts_before + 1
            first = FirstToken(-1, alone, item.ahead_s, item.factor, at - item.started_at)
            if item.end != -math.inf:
                self._uncount(item.end)
        if not self.outstanding:  # nothing left: drop any rounding left in the sum
            self._unstarted_s = 0.0
        return first

    def running_s(self, now: float) -> float:
        """Estimated prefill left of the started requests (each its estimate minus its time so far, at least 0)."""
        ends = self._ends
        while ends and ends[0][0] <= now:
            end, _, request_id = heapq.heappop(ends)
            if self._counted(request_id, end):
                self.outstanding[request_id].end = -math.inf  # ended: counts for nothing from now on
                self._uncount(end)
        return max(0.0, self._ends_sum - self._ends_live * now) if self._ends_live else 0.0

    def wait_s(self, now: float) -> float:
        return (self._unstarted_s + self.running_s(now)) / max(1, self.parallelism)

    def _counted(self, request_id: str, end: float) -> bool:
        item = self.outstanding.get(request_id)
        return item is not None and item.end == end

    def _uncount(self, end: float) -> None:
        self._ends_live -= 1
        self._ends_sum = self._ends_sum - end if self._ends_live else 0.0


class Router:
    """Chooses replicas by estimated TTFT; keeps the per-replica load bookkeeping."""

    def __init__(
        self,
        prefill_models: Sequence[PrefillModel],
        *,
        ttft_slo_s: float | None = 2.0,
        parallelism: int | Sequence[int] = 1,
        balance_abs_threshold: int = 4,
        balance_rel_threshold: float = 2.0,
        affinity_headroom: float = _ROUTING.affinity_headroom,
        starvation_window_s: float | None = _ROUTING.starvation_window_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not prefill_models:
            raise ValueError("at least one replica")
        widths = [parallelism] * len(prefill_models) if isinstance(parallelism, int) else list(parallelism)
        self.slowdown = Slowdown()
        self.loads = [ReplicaLoad(m, p, slowdown=self.slowdown) for m, p in zip(prefill_models, widths, strict=True)]
        if ttft_slo_s is not None:
            for load in self.loads:
                load.recent_s = ttft_slo_s  # arrivals within one SLO can overtake a newcomer before its deadline
        self.ttft_slo_s = ttft_slo_s
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.affinity_headroom = affinity_headroom
        self.starvation_window_s = starvation_window_s
        """The waiting queues' window (:class:`~proxy.kv.admission_queue.AdmissionQueue`), to foresee their order;
        ``None``: the order is not foreseen, and only what could not start in time at the head of its queue is
        refused."""
        self._clock = clock
        self.tracks_load = len(self.loads) > 1 or ttft_slo_s is not None
        """Whether a decision can depend on load: several replicas to compare, or an SLO to refuse by."""

    def estimate(self, candidate: Candidate, now: float | None = None) -> tuple[float, float]:
        """``(estimated ttft, prefill part)`` of ``candidate`` in seconds."""
        now = self._clock() if now is None else now
        load = self.loads[candidate.replica]
        uncached = max(0, candidate.total_tokens - candidate.cached_tokens)
        prefill = load.prefill.seconds(uncached, candidate.cached_tokens) * self.slowdown.factor(now)
        return load.wait_s(now) + prefill, prefill

    def imbalanced(self) -> bool:
        counts = [load.active for load in self.loads]
        busiest, idlest = max(counts), min(counts)
        return busiest - idlest > self.balance_abs_threshold and busiest > self.balance_rel_threshold * idlest

    def choose(self, candidates: Sequence[Candidate]) -> RouteDecision | Reject:
        """The replica for a request, or a refusal when no replica can meet the SLO."""
        if not candidates:
            raise ValueError("no candidates")
        if not self.tracks_load:
            return self._only(candidates[0])
        now = self._clock()
        slo = self.ttft_slo_s
        scored = []
        for c in candidates:
            ttft, prefill = self.estimate(c, now)
            scored.append((ttft, self.loads[c.replica].active, c.replica, c, prefill))
        if slo is not None:  # only the replicas where it is expected to start in time
            expected = [(self._expected_ttft(s[3], s[0], s[4], now, slo), s) for s in scored]
            scored = [s for ttft, s in expected if ttft <= slo]
            if not scored:
                best_s = min(ttft for ttft, _ in expected)
                return Reject(max(1, math.ceil(best_s - slo)), best_s)
        comfortable = [s for s in scored if s[0] <= slo * self.affinity_headroom] if slo is not None else []
        if len(scored) == 1:  # nothing to compare
            best, reason = scored[0], "ttft"
        elif self.imbalanced():
            best, reason = min(scored, key=lambda s: (s[1], s[0], s[2])), "balance"
        elif len(comfortable) > 1:
            best, reason = min(comfortable, key=lambda s: (round(s[4], 3), s[0], s[1], s[2])), "affinity"
        else:
            best, reason = min(scored, key=lambda s: (s[0], s[1], s[2])), "ttft"
        ttft, _, replica, candidate, prefill = best
        return RouteDecision(
            replica=replica,
            estimated_ttft_s=ttft,
            cached_tokens=candidate.cached_tokens,
            uncached_tokens=max(0, candidate.total_tokens - candidate.cached_tokens),
            prefill_s=prefill,
            reason=reason,
            start_deadline=None if slo is None else now + slo - prefill,
        )

    def _expected_ttft(self, candidate: Candidate, estimate_s: float, prefill_s: float, now: float,
                       slo: float) -> float:
        """Time to first token of ``candidate`` when its queue lets it start as its order foresees (module docs),
        or a bound of it when the bound already says whether it is within ``slo``."""
        load = self.loads[candidate.replica]
        head = load.running_s(now) / max(1, load.parallelism) + prefill_s
        if self.starvation_window_s is None or head > slo:  # not even at the head of its queue
            return head
        ratio = candidate.cached_tokens / max(1, candidate.total_tokens - candidate.cached_tokens)
        flow = OVERTAKING_SHARE * load.overtaking(ratio, now)
        if flow < 1.0:  # behind all that waits and the flow: within the SLO, the replay can only say so too
            bound = (estimate_s - prefill_s) / (1.0 - flow) + prefill_s
            if bound <= slo:
                return bound
        start = expected_start(load.waiting(), ratio, now, now + head - prefill_s, self.starvation_window_s,
                               load.parallelism, flow)
        return start - now + prefill_s

    def _only(self, candidate: Candidate) -> RouteDecision:
        """The decision when nothing can be compared or refused (no load tracked: the estimate is the prefill)."""
        ttft, prefill = self.estimate(candidate)
        return RouteDecision(replica=candidate.replica, estimated_ttft_s=ttft, cached_tokens=candidate.cached_tokens,
                             uncached_tokens=max(0, candidate.total_tokens - candidate.cached_tokens),
                             prefill_s=prefill, reason="ttft")

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def admitted(self, request_id: str, decision: RouteDecision) -> None:
        """The request was sent to (or queued for) ``decision.replica``."""
        if not self.tracks_load:
            return
        load = self.loads[decision.replica]
        ratio = decision.cached_tokens / max(1, decision.uncached_tokens)
        place = Waiting(decision.prefill_s, ratio, self._clock(), decision.start_deadline)
        load.add(request_id, decision.prefill_s, place)
        load.active += 1

    def started(self, request_id: str, replica: int) -> None:
        """The request left the waiting queue and its prefill began."""
        if self.tracks_load:
            self.loads[replica].start(request_id, self._clock())

    def first_token(self, request_id: str, replica: int) -> FirstToken | None:
        """Its prefill is done: no more prefill work ahead of others. Returns what the router knew of it
        (:class:`FirstToken`), ``None`` when no load is tracked or it had not started."""
        if not self.tracks_load:
            return None
        first = self.loads[replica].remove(request_id, self._clock())
        return None if first is None else replace(first, replica=replica)

    def measured(self, first: FirstToken, computed_tokens: int, cached_tokens: int, decode_s: float = 0.0) -> None:
        """The backend computed ``computed_tokens`` after ``cached_tokens`` for the request of ``first``, and spent
        ``decode_s`` of its elapsed time generating after its first token (a reply not streamed arrives whole):
        the slowdown learns how far the estimate of that prefill, with what was really cached, was off."""
        prefill = self.loads[first.replica].prefill.seconds(computed_tokens, cached_tokens)
        expected = first.ahead_s + prefill * first.factor
        self.slowdown.measure(expected, first.elapsed_s - decode_s)

    def finished(self, request_id: str, replica: int) -> None:
        if not self.tracks_load:
            return
        load = self.loads[replica]
        load.remove(request_id)
        load.active = max(0, load.active - 1)
