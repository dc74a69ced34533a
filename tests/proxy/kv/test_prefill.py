"""Prefill-time model: defaults and least-squares refit from observations."""

from __future__ import annotations

import pytest

from proxy.kv.prefill import PrefillCoefficients, PrefillModel


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
