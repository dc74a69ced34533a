"""Prefill-time model: defaults and least-squares refit from observations."""

from __future__ import annotations

import pytest

from proxy.kv.prefill import PrefillCoefficients, PrefillModel, share_fits


def test_estimate_grows_with_new_tokens_and_context() -> None:
    model = PrefillModel(PrefillCoefficients(0.01, 0.001, 0.0005))
    assert model.seconds(0) == 0
    assert model.seconds(100) < model.seconds(200)
    assert model.seconds(100, cached_tokens=0) < model.seconds(100, cached_tokens=2000)
    assert model.marginal_seconds(100, 0) == pytest.approx(model.seconds(100) - 0.01)


def test_refit_recovers_the_coefficients_of_noise_free_observations() -> None:
    truth = PrefillModel(PrefillCoefficients(0.05, 0.0004, 0.0002))
    model = PrefillModel(min_observations=5)
    for n, c in [(100, 0), (500, 0), (1000, 200), (2000, 1000), (300, 2500), (1500, 0), (50, 3000)]:
        model.observe(n, c, truth.seconds(n, c))
    fitted = model.coefficients
    assert fitted.fixed_s == pytest.approx(0.05, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(0.0004, rel=1e-6)
    assert fitted.per_token_context_s == pytest.approx(0.0002, rel=1e-6)


def test_refit_keeps_coefficients_non_negative() -> None:
    model = PrefillModel(min_observations=3)
    for n, s in [(100, 0.5), (1000, 0.4), (2000, 0.3), (3000, 0.2)]:
        model.observe(n, 0, s)
    c = model.coefficients
    assert c.fixed_s >= 0 and c.per_token_s >= 0 and c.per_token_context_s >= 0


def test_a_replica_not_fitted_yet_takes_the_fitted_ones_coefficients_until_it_has_its_own() -> None:
    truth = PrefillModel(PrefillCoefficients(0.01, 0.0002, 0.0))
    first, second = PrefillModel(min_observations=3), PrefillModel(min_observations=3)
    cold = PrefillModel(PrefillCoefficients(0.02, 0.0006, 0.0), min_observations=3)
    assert share_fits([first, second, cold])  # nothing fitted: nothing to share
    assert cold.coefficients == PrefillCoefficients(0.02, 0.0006, 0.0)
    for n in (100, 800, 2000):
        first.observe(n, 0, truth.seconds(n))
    assert first.fitted and not cold.fitted
    assert share_fits([first, second, cold])
    assert cold.coefficients == second.coefficients == first.coefficients
    for n in (300, 900, 1500):
        cold.observe(n, 0, 2 * truth.seconds(n))  # a slower replica: its own fit replaces the borrowed one
    assert cold.fitted and cold.seconds(1000) == pytest.approx(2 * first.seconds(1000))
    share_fits([first, second, cold])
    assert cold.seconds(1000) == pytest.approx(2 * first.seconds(1000))
    assert second.coefficients.fixed_s == pytest.approx((0.01 + 0.02) / 2)  # the mean of the fitted two
