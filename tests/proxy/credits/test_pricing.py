"""Prices, hit discounts, cached-token rates and the worst case (pure)."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.outcome import MICRO
from proxy.core.usage import Usage
from proxy.credits.pricing import ModelLimits, ModelPrice, PriceBook, format_credits, to_micro

GPT = ModelPrice(Decimal("0.5"), Decimal("1.5"), Decimal("0.25"))
BOOK = PriceBook(
    models={"gpt": GPT, "plain": ModelPrice(Decimal("1"), Decimal("2"))},
    limits={"gpt": ModelLimits(context_tokens=8000, max_completion_tokens=1000)},
    hit_multipliers={
        "l1": Decimal("0.1"),
        "l2": Decimal("0.2"),
        "l3": Decimal("0.3"),
        "retrieval": Decimal("0.05"),
    },
    default_hit_multiplier=Decimal("0.5"),
    search_price=Decimal("0.01"),
)


def test_units_round_up_to_whole_micro_credits() -> None:
    assert to_micro(Decimal("1")) == MICRO
    assert to_micro(Decimal("0.0000001")) == 1
    assert to_micro("0.0000010") == 1
    assert format_credits(1_500_000) == "1.5"
    assert format_credits(-1250) == "-0.00125"
    assert format_credits(0) == "0"
    assert format_credits(10 * MICRO) == "10"


def test_full_price_of_an_upstream_reply() -> None:
    # 1000 prompt tokens at 0.5/1k + 2000 completion tokens at 1.5/1k = 0.5 + 3 = 3.5 credits
    assert BOOK.actual_cost("gpt", Usage(1000, 2000, 0)) == 3_500_000


def test_cached_prompt_tokens_at_their_own_rate() -> None:
    # 600 uncached at 0.5/1k (0.3) + 400 cached at 0.25/1k (0.1) + 0 completion
    assert BOOK.actual_cost("gpt", Usage(1000, 0, 400)) == 400_000
    # no cached rate configured: cached tokens cost as much as any prompt token
    assert BOOK.actual_cost("plain", Usage(1000, 0, 400)) == BOOK.actual_cost("plain", Usage(1000, 0, 0))
    # a backend claiming more cached than prompt tokens cannot make the prompt cheaper than all-cached
    assert BOOK.actual_cost("gpt", Usage(1000, 0, 5000)) == 250_000


@pytest.mark.parametrize(
    ("tier", "expected"),
    [
        (None, 3_500_000),
        ("l1", 350_000),
        ("L2", 700_000),
        ("l3", 1_050_000),
        ("retrieval", 175_000),
        ("mystery", 1_750_000),
    ],
)
def test_hit_pricing_per_tier(tier: str | None, expected: int) -> None:
    assert BOOK.actual_cost("gpt", Usage(1000, 2000, 0), tier) == expected


def test_default_hit_multiplier_is_a_tenth() -> None:
    book = PriceBook()
    full = book.actual_cost("any", Usage(1000, 1000))
    assert {tier: book.actual_cost("any", Usage(1000, 1000), tier) for tier in ("l1", "l2", "l3", "retrieval")} == {
        "l1": full // 10,
        "l2": full // 10,
        "l3": full // 10,
        "retrieval": full // 10,
    }


def test_unknown_models_use_the_default_price() -> None:
    book = PriceBook(default_price=ModelPrice(Decimal("2"), Decimal("4")))
    assert book.actual_cost("who-knows", Usage(500, 250)) == 2 * MICRO


def test_vector_searches() -> None:
    assert BOOK.search_cost() == 10_000
    assert BOOK.search_cost(3) == 30_000
    assert BOOK.search_cost(3, "retrieval") == 1_500


def test_worst_case_from_max_tokens_and_body_size() -> None:
    body = {"model": "gpt", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100}
    size = len(orjson.dumps(body))
    # prompt bound = body bytes at the higher of prompt/cached rate (0.5/1k); completion 100 at 1.5/1k
    assert BOOK.worst_case(body) == to_micro((Decimal(size) * Decimal("0.5") + 100 * Decimal("1.5")) / 1000)
    assert BOOK.worst_case(body, raw_size=1000) == to_micro(Decimal("0.5") + Decimal("0.15"))


def test_worst_case_without_max_tokens_uses_the_model_limit() -> None:
    body = {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}
    assert BOOK.worst_case(body, raw_size=0) == to_micro(1000 * Decimal("1.5") / 1000)
    capped = {**body, "max_completion_tokens": 50_000}
    assert BOOK.worst_case(capped, raw_size=0) == BOOK.worst_case(body, raw_size=0)
    several = {**body, "max_tokens": 10, "n": 3}
    assert BOOK.worst_case(several, raw_size=0) == to_micro(30 * Decimal("1.5") / 1000)
    huge_prompt = BOOK.worst_case(body, raw_size=10**9)
    assert huge_prompt == to_micro((8000 * Decimal("0.5") + 1000 * Decimal("1.5")) / 1000)


def test_worst_case_of_an_embedding_request_has_no_completion() -> None:
    assert BOOK.worst_case({"model": "plain", "input": "abc"}, raw_size=1000) == MICRO


def test_bytes_per_token_estimate() -> None:
    book = PriceBook(prompt_bytes_per_token=Decimal(4), default_price=ModelPrice(Decimal(1), Decimal(0)))
    assert book.worst_case({"input": "x"}, raw_size=4000) == MICRO


usages = st.builds(
    Usage,
    st.integers(0, 200_000),
    st.integers(0, 50_000),
    st.integers(0, 200_000),
)


@given(usages, st.sampled_from([None, "l1", "l2", "l3", "retrieval", "other"]))
def test_a_hit_never_costs_more_than_the_full_reply(usage: Usage, tier: str | None) -> None:
    assert 0 <= BOOK.actual_cost("gpt", usage, tier) <= BOOK.actual_cost("gpt", usage)


@given(st.text(max_size=2000), st.integers(1, 1000), st.integers(0, 1000), st.integers(0, 1000))
def test_the_worst_case_covers_any_usage_within_the_request_s_bounds(
    text: str, max_tokens: int, completion: int, cached: int
) -> None:
    body = {"model": "gpt", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    prompt_tokens = len(text.encode())  # at most one token per byte of the text
    usage = Usage(prompt_tokens, min(completion, max_tokens), min(cached, prompt_tokens))
    assert BOOK.actual_cost("gpt", usage) <= BOOK.worst_case(body)


def test_a_responses_request_is_bounded_by_max_output_tokens_never_priced_as_an_embedding() -> None:
    body = {"model": "plain", "input": "abc"}
    assert BOOK.worst_case(body, raw_size=1000) == MICRO, "read as an embedding without the hint"
    limits = BOOK.default_limits.completion_cap
    assert BOOK.worst_case(body, raw_size=1000, response=True) == to_micro(Decimal(1) + limits * Decimal(2) / 1000)
    bounded = {**body, "max_output_tokens": 100}
    assert BOOK.worst_case(bounded, raw_size=1000, response=True) == to_micro(Decimal(1) + Decimal("0.2"))


def test_rerank_price_per_document_with_cached_documents_discounted() -> None:
    book = PriceBook(rerank_price=Decimal("0.01"), hit_multipliers={"l1": Decimal("0.1")})
    assert book.rerank_cost(4) == 40_000
    assert book.rerank_cost(1, 2, "l1") == 12_000
    assert book.rerank_cost(0, 3, "l1") == 3_000


def test_a_price_book_without_overrides_charges_the_settings_defaults() -> None:
    """Every default price is defined once, in the settings: the engine built from unconfigured settings and the
    price book built with no arguments are the same."""
    from proxy.assembly.config import Settings
    from proxy.assembly.credit_components import price_book

    assert price_book(Settings()) == PriceBook()
    assert PriceBook().hit_multiplier("coalesced") == Settings().credits.hit_multipliers["coalesced"]
