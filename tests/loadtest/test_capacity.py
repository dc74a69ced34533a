"""The capacity fit: a known curve recovers its capacity, noise cannot lift it, the interval holds the truth."""

from __future__ import annotations

import math
import random

import pytest

from loadtest.capacity import (
    Capacity,
    bootstrap,
    capacity_ratio,
    fit_capacity,
    non_increasing_fit,
    percentile_interval,
)

R50, SLOPE = 4.0, 6.0
TRUE_CAPACITY = R50 * 9 ** (-1 / SLOPE)  # where 1 / (1 + (r / R50) ** SLOPE) = 0.9


def share(rate: float, scale: float = 1.0) -> float:
    return float(1 / (1 + (rate / (R50 * scale)) ** SLOPE))


def sweep_of(rnd: random.Random, rates: list[float], repeats: int, sent: int, scale: float = 1.0
             ) -> dict[float, list[tuple[int, int]]]:
    return {
        rate: [(sum(rnd.random() < share(rate, scale) for _ in range(sent)), sent) for _ in range(repeats)]
        for rate in rates
    }


GRID = [round(1.5 * 1.25**i, 3) for i in range(9)]  # 1.5 .. 8.9


def test_pool_adjacent_violators() -> None:
    assert non_increasing_fit([1.0, 0.8, 0.9, 0.5], [1, 1, 1, 1]) == pytest.approx([1.0, 0.85, 0.85, 0.5])
    assert non_increasing_fit([0.2, 0.6, 1.0], [3, 1, 0]) == pytest.approx([0.3, 0.3, 0.3])
    assert non_increasing_fit([1.0, 0.5], [1, 1]) == [1.0, 0.5]


def test_a_noise_free_curve_gives_its_capacity() -> None:
    sweep = {rate: [(round(share(rate) * 10_000), 10_000)] for rate in GRID}
    fitted = fit_capacity(sweep)
    assert fitted.censored is None and fitted.rps == pytest.approx(TRUE_CAPACITY, rel=0.02)


def test_a_noisy_sweep_recovers_the_capacity_and_the_interval_holds_it() -> None:
    rnd = random.Random(7)
    sweep = sweep_of(rnd, GRID, repeats=4, sent=40)
    fitted = fit_capacity(sweep)
    assert fitted.rps == pytest.approx(TRUE_CAPACITY, rel=0.08)
    samples = [s for s in bootstrap({"a": sweep}, random.Random(1), resamples=400)["a"] if s is not None]
    low, high = percentile_interval(samples)
    assert low <= TRUE_CAPACITY <= high
    assert high / low < 1.4  # an interval, not the whole sweep


def test_one_lucky_run_at_a_high_rate_does_not_lift_the_capacity() -> None:
    sweep = {1.0: [(20, 20)], 2.0: [(19, 20)], 3.0: [(10, 20)], 4.0: [(20, 20)], 5.0: [(0, 20)]}
    fitted = fit_capacity(sweep)
    assert fitted.rps is not None and 2.0 < fitted.rps < 3.0


def test_censored_ends_are_said() -> None:
    assert fit_capacity({1.0: [(10, 10)], 2.0: [(9, 10)]}) == Capacity(2.0, "above")
    assert fit_capacity({1.0: [(5, 10)], 2.0: [(1, 10)]}) == Capacity(1.0, "below")
    assert fit_capacity({1.0: [(0, 0)]}) == Capacity(None)


def test_twice_the_capacity_is_a_ratio_of_two_and_identical_sides_a_ratio_of_one() -> None:
    grid = [round(1.5 * 1.2**i, 3) for i in range(14)]
    covered = 0
    for seed in range(10):  # a 95% interval from 4 repeats: held in most sweeps, not all
        rnd = random.Random(seed)
        base = sweep_of(rnd, grid, repeats=4, sent=60)
        double = sweep_of(rnd, grid, repeats=4, sent=60, scale=2.0)
        ratio = capacity_ratio({"x": double, "base": base}, "x", "base", resamples=200)
        assert ratio.value == pytest.approx(2.0, rel=0.12) and not ratio.censored
        assert ratio.interval is not None and ratio.interval[1] / ratio.interval[0] < 1.3
        covered += ratio.interval[0] <= 2.0 <= ratio.interval[1]
    assert covered >= 8
    same = capacity_ratio({"x": base, "base": base}, "x", "base", resamples=50)
    assert same.value == 1.0 and same.interval == (1.0, 1.0)  # paired: the same draws on both sides


def test_percentile_interval() -> None:
    assert percentile_interval([float(i) for i in range(101)], 0.9) == pytest.approx((5.0, 95.0))
    with pytest.raises(ValueError):
        percentile_interval([])
    assert math.isclose(percentile_interval([2.0])[0], 2.0)
