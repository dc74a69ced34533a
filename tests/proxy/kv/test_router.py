"""Router: lowest estimated TTFT, load-balance guard, SLO refusal, load bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kv.router import OVERTAKING_SHARE, Candidate, Reject, ReplicaLoad, RouteDecision, Router
from tests.proxy.kv.clocks import Clock, models


def test_chooses_the_replica_with_most_cached_when_idle() -> None:
    router = Router(models(3), ttft_slo_s=None, clock=Clock())
    decision = router.choose([Candidate(0, 0, 2000), Candidate(1, 1500, 2000), Candidate(2, 500, 2000)])
    assert isinstance(decision, RouteDecision)
    assert decision.replica == 1 and decision.uncached_tokens == 500
    assert decision.estimated_ttft_s == pytest.approx(0.5)


def test_queue_wait_moves_requests_to_a_colder_idle_replica() -> None:
    clock = Clock()
    router = Router(models(2), ttft_slo_s=None, clock=clock)
    busy = router.choose([Candidate(0, 0, 3000), Candidate(1, 0, 3000)])
    assert isinstance(busy, RouteDecision) and busy.replica == 0
    router.admitted("r1", busy)
    router.started("r1", 0)
    clock.t = 0.5  # 2.5 s of r1's prefill left on replica 0
    decision = router.choose([Candidate(0, 1000, 2000), Candidate(1, 0, 2000)])
    assert isinstance(decision, RouteDecision) and decision.replica == 1
    assert router.estimate(Candidate(0, 1000, 2000))[0] == pytest.approx(2.5 + 1.0)
    router.first_token("r1", 0)
    decision = router.choose([Candidate(0, 1000, 2000), Candidate(1, 0, 2000)])
    assert isinstance(decision, RouteDecision) and decision.replica == 0


def test_rejects_with_retry_after_when_no_replica_meets_the_slo() -> None:
    router = Router(models(2), ttft_slo_s=1.0, clock=Clock())
    decision = router.choose([Candidate(0, 0, 3500), Candidate(1, 1000, 4200)])
    assert isinstance(decision, Reject)
    assert decision.retry_after_s == 3  # best is 3.2 s, 2.2 s over
    assert decision.best_estimate_s == pytest.approx(3.2)


def test_balance_guard_sends_to_the_least_loaded_replica_when_imbalanced() -> None:
    router = Router(
        models(2), ttft_slo_s=None, balance_abs_threshold=3, balance_rel_threshold=1.5, clock=Clock()
    )
    for i in range(4):
        d = router.choose([Candidate(0, 2000, 2000), Candidate(1, 0, 2000)])
        assert isinstance(d, RouteDecision) and d.replica == 0 and d.reason == "ttft"
        router.admitted(f"r{i}", d)
        router.first_token(f"r{i}", 0)  # prefill done, still decoding: active but no queued work
    assert router.imbalanced()
    d = router.choose([Candidate(0, 2000, 2000), Candidate(1, 0, 2000)])
    assert isinstance(d, RouteDecision) and d.replica == 1 and d.reason == "balance"
    for i in range(4):
        router.finished(f"r{i}", 0)
    assert not router.imbalanced()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "start", "remove", "tick"]), st.integers(0, 5),
                          st.floats(0.0, 3.0, allow_nan=False)), max_size=60))
def test_queue_wait_kept_in_running_sums_equals_the_sum_over_every_request(
        steps: list[tuple[str, int, float]]) -> None:
    """The O(1) bookkeeping against the definition: unstarted prefill plus what is left of each started one."""
    load = ReplicaLoad(models(1)[0], parallelism=2)
    now = 0.0
    naive: dict[str, tuple[float, float | None]] = {}
    for op, n, value in steps:
        rid = f"r{n}"
        if op == "add":
            load.add(rid, value)
            naive[rid] = (value, None)
        elif op == "start":
            load.start(rid, now)
            if rid in naive and naive[rid][1] is None:
                naive[rid] = (naive[rid][0], now)
        elif op == "remove":
            load.remove(rid)
            naive.pop(rid, None)
        else:
            now += value
        expected = sum(p if s is None else max(0.0, p - (now - s)) for p, s in naive.values()) / 2
        assert load.wait_s(now) == pytest.approx(expected, abs=1e-9)


def test_first_token_tells_whether_the_prefill_ran_alone() -> None:
    clock = Clock()
    router = Router(models(2), ttft_slo_s=None, clock=clock)

    def alone(name: str) -> bool:
        first = router.first_token(name, 0)
        assert first is not None and first.replica == 0
        return first.alone

    for name in ("a", "b", "c", "d"):
        router.admitted(name, RouteDecision(0, 1.0, 0, 1000, 1.0, "ttft"))
    router.started("a", 0)
    assert alone("a")  # nothing else ran meanwhile
    router.started("b", 0)
    router.started("c", 0)  # starts while b runs: both were slowed
    assert not alone("b")
    router.started("d", 0)  # c still runs
    assert not alone("c")
    assert not alone("d")
    clock.t = 5.0  # estimates long expired: what counts is that the requests were still running
    router.admitted("e", RouteDecision(0, 1.0, 0, 1000, 1.0, "ttft"))
    router.started("e", 0)
    assert alone("e")
    assert router.first_token("e", 0) is None  # already gone


def _run(router: Router, clock: Clock, name: str, took_s: float, computed: int, cached: int = 0) -> None:
    decision = router.choose([Candidate(0, cached, computed + cached)])
    assert isinstance(decision, RouteDecision)
    router.admitted(name, decision)
    router.started(name, 0)
    clock.t += took_s
    first = router.first_token(name, 0)
    assert first is not None
    router.measured(first, computed, cached)


def test_estimates_follow_the_measured_slowdown_and_relax_while_every_replica_idles() -> None:
    clock = Clock()
    router = Router(models(2), ttft_slo_s=None, clock=clock)
    for i in range(30):  # first tokens come twice as late as a 1 s estimate, every time
        _run(router, clock, f"r{i}", 2.0, 1000)
    assert router.slowdown.factor(clock.t) == pytest.approx(2.0, rel=0.02)
    assert router.estimate(Candidate(0, 0, 1000))[0] == pytest.approx(2.0, rel=0.02)
    # one factor for all replicas: an idle one does not look faster for having relaxed alone
    assert router.estimate(Candidate(1, 0, 1000))[0] == pytest.approx(2.0, rel=0.02)
    clock.t += 10.0  # one half-life with every replica idle
    assert router.slowdown.factor(clock.t) == pytest.approx(1.5, rel=0.02)
    router.admitted("busy", RouteDecision(0, 1.0, 0, 1000, 1.0, "ttft"))
    router.started("busy", 0)  # busy again: the relaxed value stands while it runs
    clock.t += 30.0
    assert router.slowdown.factor(clock.t) == pytest.approx(1.5, rel=0.02)


def test_the_slowdown_measures_speed_not_a_wrong_guess_of_what_was_cached() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=10.0, clock=clock)  # (an SLO: one replica then tracks its load)
    for i in range(20):  # predicted 900 of 1000 cached, the backend had none: 1 s of prefill, exactly the model's
        decision = router.choose([Candidate(0, 900, 1000)])
        assert isinstance(decision, RouteDecision) and decision.prefill_s == pytest.approx(0.1)
        router.admitted(f"r{i}", decision)
        router.started(f"r{i}", 0)
        clock.t += 1.0
        first = router.first_token(f"r{i}", 0)
        assert first is not None
        router.measured(first, computed_tokens=1000, cached_tokens=0)
    assert router.slowdown.value == pytest.approx(1.0)


def test_a_non_streamed_reply_is_measured_without_its_decode_time() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=1.0, clock=clock)
    router.admitted("a", RouteDecision(0, 0.5, 0, 500, 0.5, "ttft"))
    router.started("a", 0)
    clock.t = 3.5  # the whole reply, of which 3 s were generation after a first token on time
    first = router.first_token("a", 0)
    assert first is not None
    router.measured(first, 500, 0, decode_s=3.0)
    assert router.slowdown.value == pytest.approx(1.0)


def test_running_is_the_estimated_prefill_left_of_the_started_requests() -> None:
    load = ReplicaLoad(models(1)[0])
    load.add("a", 2.0)
    load.add("b", 1.0)
    load.start("a", now=0.0)
    assert load.running_s(0.5) == pytest.approx(1.5)  # b has not started: not in hand yet
    assert load.wait_s(0.5) == pytest.approx(2.5)
    assert load.running_s(3.0) == 0.0


def test_one_replica_without_slo_keeps_no_load_and_estimates_the_prefill() -> None:
    router = Router(models(1), ttft_slo_s=None, clock=Clock())
    assert not router.tracks_load
    for i in range(50):
        decision = router.choose([Candidate(0, 0, 4000)])
        assert isinstance(decision, RouteDecision)
        router.admitted(f"r{i}", decision)
        router.started(f"r{i}", 0)
    assert decision.replica == 0
    assert decision.estimated_ttft_s == decision.prefill_s > 0  # no queue wait: nothing is tracked
    assert router.loads[0].active == 0 and not router.loads[0].outstanding


def test_one_replica_with_an_slo_keeps_load_and_refuses() -> None:
    router = Router(models(1), ttft_slo_s=1.0, clock=Clock())
    assert router.tracks_load
    refused = None
    for i in range(200):
        decision = router.choose([Candidate(0, 0, 400)])
        if isinstance(decision, Reject):
            refused = decision
            break
        router.admitted(f"r{i}", decision)
        router.started(f"r{i}", 0)  # started: their prefill is in hand, ahead of any newcomer
    assert refused is not None and router.loads[0].active == 2  # 0.4 s each: a third would see 1.2 s


def queued(router: Router, name: str, prefill_s: float, cached: int = 0, deadline: float | None = None) -> None:
    """Admit a request of ``prefill_s`` (1 ms per uncached token) that waits for a slot."""
    uncached = round(prefill_s * 1000)
    router.admitted(name, RouteDecision(0, prefill_s, cached, uncached, prefill_s, "ttft", deadline))


def test_a_request_that_would_wait_past_its_start_deadline_in_the_queue_order_is_refused_at_arrival() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=1.0, clock=clock)
    queued(router, "running", 0.4)
    router.started("running", 0)
    for i in range(3):  # 1.2 s of prefill waiting, none cached: a newcomer with nothing cached goes after them
        queued(router, f"waiting{i}", 0.4)
    refused = router.choose([Candidate(0, 0, 400)])  # at the head it would have made it: 0.4 + 0.4 <= 1.0
    assert isinstance(refused, Reject) and refused.best_estimate_s == pytest.approx(2.0)


def test_a_request_the_cache_aware_order_lets_go_first_is_admitted_past_the_full_queue_estimate() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=1.0, clock=clock)
    queued(router, "running", 0.4)
    router.started("running", 0)
    for i in range(3):
        queued(router, f"waiting{i}", 0.4)
    decision = router.choose([Candidate(0, 300, 400)])  # 300 cached of 400: goes before those computing 400
    assert isinstance(decision, RouteDecision)
    assert decision.estimated_ttft_s == pytest.approx(1.7)  # over the SLO behind everyone ...
    assert decision.start_deadline == pytest.approx(0.9)  # ... but expected to start at 0.4


def test_requests_ahead_that_will_miss_their_own_deadline_do_not_count() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=1.0, clock=clock)
    queued(router, "running", 0.4)
    router.started("running", 0)
    for i in range(3):  # they cannot start before 0.4: the queue will drop them
        queued(router, f"doomed{i}", 0.4, deadline=0.3)
    assert isinstance(router.choose([Candidate(0, 0, 400)]), RouteDecision)


def test_older_requests_that_starve_go_first_within_the_window() -> None:
    def newcomer(window_s: float) -> RouteDecision | Reject:
        clock = Clock()
        router = Router(models(1), ttft_slo_s=1.0, starvation_window_s=window_s, clock=clock)
        queued(router, "running", 0.4)
        router.started("running", 0)
        for i in range(2):
            queued(router, f"old{i}", 0.4)
        clock.t = 0.2
        return router.choose([Candidate(0, 300, 400)])  # better ratio; deadline 0.2 + 1.0 - 0.1 = 1.1

    assert isinstance(newcomer(2.0), RouteDecision)  # starts at 0.4, before the older ones
    assert isinstance(newcomer(0.3), Reject)  # at 0.4 they have waited 0.4 s: they go first, it would start at 1.2


def test_without_the_queue_order_only_what_misses_at_the_head_is_refused() -> None:
    clock = Clock()
    router = Router(models(1), ttft_slo_s=1.0, starvation_window_s=None, clock=clock)
    queued(router, "running", 0.4)
    router.started("running", 0)
    for i in range(3):
        queued(router, f"waiting{i}", 0.4)
    assert isinstance(router.choose([Candidate(0, 0, 400)]), RouteDecision)
    queued(router, "late", 0.5)
    router.started("late", 0)  # now 0.9 s in hand: 0.9 + 0.4 > 1.0 even at the head of the queue
    assert isinstance(router.choose([Candidate(0, 0, 400)]), Reject)


def test_only_a_replica_that_can_start_it_in_time_is_chosen() -> None:
    clock = Clock()
    router = Router(models(2), ttft_slo_s=1.0, clock=clock)
    for replica, names in ((0, ["r0", "w0", "w1"]), (1, ["r1", "w2", "w3", "w4"])):
        for n in names:
            router.admitted(n, RouteDecision(replica, 0.4, 0, 400, 0.4, "ttft"))
        router.started(names[0], replica)
    # replica 0 is estimated lower (1.6 s against 1.7 s) and the newcomer would wait behind both that wait there;
    # on replica 1 its 300 cached tokens put it first: 0.4 + 0.1 s
    decision = router.choose([Candidate(0, 0, 400), Candidate(1, 300, 400)])
    assert isinstance(decision, RouteDecision) and decision.replica == 1


def test_a_flow_of_better_placed_arrivals_overtakes_a_newcomer_until_its_deadline() -> None:
    def newcomer(served: int, cached: int = 0) -> RouteDecision | Reject:
        clock = Clock()
        router = Router(models(1), ttft_slo_s=1.0, clock=clock)
        queued(router, "running", 0.2)
        router.started("running", 0)
        for i in range(served):  # 0.1 s each, 3 cached tokens per computed one: they go first when they come
            queued(router, f"served{i}", 0.1, cached=300)
            router.started(f"served{i}", 0)
            router.first_token(f"served{i}", 0)
            router.finished(f"served{i}", 0)
        return router.choose([Candidate(0, cached, cached + 400)])  # deadline 1.0 - 0.4 = 0.6

    assert OVERTAKING_SHARE == 0.5  # half of the recent rate is expected to come while the newcomer waits:
    assert isinstance(newcomer(0), RouteDecision)  # starts at 0.2
    assert isinstance(newcomer(12), RouteDecision)  # 1.2 s/s of them, 0.6 expected: starts at 0.2 / (1 - 0.6) = 0.5
    assert isinstance(newcomer(16), Reject)  # 0.8 expected: at 1.0
    assert isinstance(newcomer(16, cached=1200), RouteDecision)  # as well placed as they are: not overtaken
