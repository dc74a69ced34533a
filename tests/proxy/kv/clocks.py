"""Shared helpers of the KV routing tests: a settable clock and prefill models of 1 ms per token."""

from __future__ import annotations

from proxy.kv.prefill import PrefillCoefficients, PrefillModel


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def models(n: int) -> list[PrefillModel]:
    return [PrefillModel(PrefillCoefficients(0.0, 0.001, 0.0)) for _ in range(n)]  # 1 ms per token
