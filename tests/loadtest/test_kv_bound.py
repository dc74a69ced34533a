"""The kv benchmarks' prefill bound in time (:mod:`loadtest.bench._kv_bound`), on timing rows generated from known
prefill coefficients."""

from __future__ import annotations

import pytest

from loadtest.bench._kv_bound import prefill_bound
from loadtest.bench._kv_reuse import Phase
from loadtest.bench.kv import Sequential, measured_bound
from loadtest.goodput import OK, Outcome
from proxy.kv.prefill import PrefillCoefficients, PrefillModel


def _rows(coefficients: PrefillCoefficients, count: int = 12) -> list[Outcome]:
    """Timing rows as a server reports them, ``prompt_ms`` exactly the model's for a grid of (computed, cached)."""
    model = PrefillModel(coefficients)
    grid = [(n, c) for n in (100, 300, 700, 1500) for c in (0, 400, 1200)][:count]
    return [Outcome(OK, 1.0, cache_n=c, prompt_n=n, prompt_ms=model.seconds(n, c) * 1000) for n, c in grid]


PEER = [(0, Outcome(OK, 1.0, cache_n=0, prompt_n=1000)), (1, Outcome(OK, 1.0, cache_n=0, prompt_n=1000))]
"""Two requests of 1,000 server tokens, none reused by the peer."""
CEILING = [(250, 500), (250, 500)]
"""The ceiling reuses half of each (in estimated tokens, half the server's count): 500 cached, 500 computed."""


def test_the_time_bound_is_the_ratio_of_the_fitted_model_on_both_splits() -> None:
    bound = prefill_bound(_rows(PrefillCoefficients(0.02, 0.001, 0.0)), "smg", PEER, CEILING)
    # peer: 0.02 + 0.001 x 1000 = 1.02 s per request; ceiling: 0.02 + 0.001 x 500 = 0.52 s
    assert bound.time == pytest.approx(1.02 / 0.52)
    assert bound.tokens == 2.0
    assert (bound.requests, bound.fit_rows) == (2, 12)
    assert bound.coefficients is not None
    assert bound.coefficients.fixed_s == pytest.approx(0.02)
    assert bound.fields()["prefill_bound_peer"] == "smg"


def test_cheap_early_tokens_put_the_time_bound_below_the_token_share() -> None:
    with_context = prefill_bound(_rows(PrefillCoefficients(0.0, 0.001, 0.001)), "smg", PEER, CEILING)
    # peer: 1.0 + 0.001 x 1000 x 500 / 1000 = 1.5 s; ceiling: 0.5 + 0.001 x 500 x 750 / 1000 = 0.875 s
    assert with_context.time == pytest.approx(1.5 / 0.875)
    assert with_context.tokens is not None and with_context.time < with_context.tokens
    # without the fixed part and the context term, time is proportional to tokens computed: the two bounds agree
    linear = prefill_bound(_rows(PrefillCoefficients(0.0, 0.001, 0.0)), "smg", PEER, CEILING)
    assert linear.time == pytest.approx(linear.tokens)


def test_too_few_timing_rows_give_no_time_bound() -> None:
    few = prefill_bound(_rows(PrefillCoefficients(0.02, 0.001, 0.0), count=5), "direct", PEER, CEILING)
    assert few.time is None and few.coefficients is None
    assert few.tokens == 2.0  # needs no fit
    assert few.fields()["prefill_bound_time"] is None
    alike = [Outcome(OK, 1.0, cache_n=0, prompt_n=500, prompt_ms=520.0)] * 10  # one point cannot fit three terms
    assert prefill_bound(alike, "direct", PEER, CEILING).time is None


def test_the_measured_bound_takes_smg_else_direct_on_the_measured_requests() -> None:
    rows = _rows(PrefillCoefficients(0.02, 0.001, 0.0))
    none_reused = Outcome(OK, 1.0, cache_n=0, prompt_n=1000)
    half_reused = Outcome(OK, 1.0, cache_n=500, prompt_n=500)
    # two warm-up requests, two measured ones; the ceiling of the measured ones reuses half
    ceiling = [(0, 500), (0, 500), *CEILING]
    cold = Phase([], rows[:6], {"smg": [half_reused] * 2})
    steady = Phase([], rows[6:], {"smg": [none_reused] * 2})
    result = Sequential(10.0, cold, steady, {})
    bound = measured_bound(result, ceiling, first=2)
    assert (bound.peer, bound.fit_rows, bound.requests) == ("smg", 12, 2)
    assert bound.time == pytest.approx(1.02 / 0.52)
    without_smg = Sequential(10.0, Phase([], rows[:6]), Phase([half_reused] * 2, rows[6:]), {})
    direct = measured_bound(without_smg, ceiling, first=2)
    assert (direct.peer, direct.fit_rows) == ("direct", 12)
    assert direct.time == pytest.approx(1.0)  # direct reused what the ceiling does
