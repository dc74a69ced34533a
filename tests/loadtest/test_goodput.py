"""The load benchmark's arithmetic: arrivals, per-run figures, the rate the ratio is read at, and the open loop."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics

import pytest

from loadtest.bench.kv_load import next_rate, open_loop
from loadtest.goodput import (
    ERROR,
    LATE,
    OK,
    REJECTED,
    Outcome,
    RunFigures,
    goodput_ratio,
    percentile,
    poisson_arrivals,
    ratio_rate,
    run_figures,
)


def test_arrivals_are_a_poisson_process_of_the_rate() -> None:
    times = poisson_arrivals(20.0, 500.0, random.Random(3))
    assert times == sorted(times) and times[0] > 0 and times[-1] < 500.0
    assert len(times) == pytest.approx(20.0 * 500, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.05)  # exponential: sd = mean


def test_the_same_seed_gives_both_sides_the_same_send_times() -> None:
    assert poisson_arrivals(5.0, 10.0, random.Random("1-5.0")) == poisson_arrivals(5.0, 10.0, random.Random("1-5.0"))
    assert poisson_arrivals(0.0, 10.0, random.Random(1)) == []


def test_goodput_counts_only_answers_within_the_objective() -> None:
    outcomes = [
        Outcome(OK, 0.2, cache_n=300, prompt_n=100, prompt_ms=150),
        Outcome(OK, 0.4, cache_n=0, prompt_n=400, prompt_ms=300),
        Outcome(OK, 1.5, cache_n=100, prompt_n=100, prompt_ms=200),  # answered, but late
        Outcome(REJECTED, 0.001),  # a 429 is not goodput
        Outcome(LATE, 4.0),
        Outcome(ERROR, 0.01),
    ]
    figures = run_figures(2.0, 10.0, outcomes, slo_s=1.0)
    assert figures.goodput_rps == 2 / 10
    assert figures.attainment == 2 / 6  # refusals, late and failed requests count as misses
    assert (figures.rejected, figures.late, figures.errors, figures.sent) == (1, 1, 1, 6)
    assert figures.ttft_p50_ms == 400 and figures.ttft_p99_ms == 1500  # over the answered ones
    assert figures.reuse == 400 / 1000
    assert figures.prefill_share == pytest.approx(650 / 2100)


def test_a_run_with_nothing_answered() -> None:
    figures = run_figures(1.0, 5.0, [Outcome(REJECTED, 0.0)], slo_s=1.0)
    assert figures.goodput_rps == 0 and figures.ttft_p50_ms is None and figures.reuse == 0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 3], 0.5) == 3
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert percentile([1.0, 2.0], 0.99) == 2.0


def _figures(rate: float, attainment: float, goodput: float) -> RunFigures:
    return RunFigures(rate, 100, goodput, attainment, 0, 0, 0, 0, 0, None, None, 0.0, 0.0)


def test_the_ratio_is_read_at_the_highest_rate_where_direct_meets_the_objective_for_half() -> None:
    direct = {1.0: _figures(1.0, 0.98, 0.98), 2.0: _figures(2.0, 0.6, 1.2), 3.0: _figures(3.0, 0.2, 0.6)}
    proxy = {1.0: _figures(1.0, 1.0, 1.0), 2.0: _figures(2.0, 0.95, 1.9), 3.0: _figures(3.0, 0.8, 2.4)}
    assert ratio_rate(direct) == 2.0
    assert goodput_ratio(direct, proxy) == (2.0, pytest.approx(1.9 / 1.2))
    # not at the overloaded rate, where any admission control wins by a large factor
    assert goodput_ratio(direct, proxy)[1] != pytest.approx(4.0)


def test_no_ratio_when_direct_never_meets_the_objective() -> None:
    direct = {1.0: _figures(1.0, 0.3, 0.3)}
    assert ratio_rate(direct) is None
    assert goodput_ratio(direct, {1.0: _figures(1.0, 0.9, 0.9)}) == (None, None)


def test_the_search_brackets_then_halves_the_direct_sides_knee() -> None:
    passing, failing = _figures(1.0, 0.8, 0.8), _figures(2.0, 0.3, 0.6)
    assert next_rate({}, start=1.0) == 1.0
    assert next_rate({1.0: passing}, start=1.0) == 1.6  # met everywhere: higher
    assert next_rate({2.0: failing}, start=2.0) == 1.25  # met nowhere: lower
    assert next_rate({1.0: passing, 2.0: failing}, start=1.0) == 1.5
    assert next_rate({1.0: passing, 1.05: failing}, start=1.0) is None  # within 10%: found
    # a noisy failure below a passing rate does not bracket anything
    assert next_rate({0.5: _figures(0.5, 0.4, 0.2), 1.0: passing}, start=1.0) == 1.6


class _Side:
    """A side that answers after a set delay per request (or refuses odd ones)."""

    def __init__(self, delays: dict[int, float]) -> None:
        self.delays = delays
        self.sent_at: dict[int, float] = {}

    async def send(self, index: int) -> Outcome:
        self.sent_at[index] = asyncio.get_running_loop().time()
        await asyncio.sleep(self.delays[index])
        if index == 12:
            raise RuntimeError("connection reset")
        return Outcome(OK, self.delays[index])


def test_the_open_loop_sends_on_schedule_whatever_earlier_requests_do() -> None:
    side = _Side({10: 0.5, 11: 0.01, 12: 0.01, 13: 0.01})
    arrivals = [0.0, 0.05, 0.1, 0.15]

    async def run() -> tuple[list[Outcome], float]:
        start = asyncio.get_running_loop().time()
        return await open_loop(side, 10, arrivals, give_up_s=0.3), start

    outcomes, start = asyncio.run(run())
    # request 10 is slow, yet 11 left at its own time (open loop), and 10 was given up on
    assert side.sent_at[11] - start == pytest.approx(0.05, abs=0.03)
    assert [o.status for o in outcomes] == [LATE, OK, ERROR, OK]
    assert outcomes[0].ttft_s == pytest.approx(0.3, abs=0.05)
