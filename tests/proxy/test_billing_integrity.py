"""Nothing for free: a reused X-Request-ID, an abandoned stream and Idempotency-Key repeats, through the real data
plane (embedded credit store) with the official openai SDK and httpx as clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.core.outcome import MICRO
from proxy.credits.store import LedgerEntry, LedgerFilter, ledger_entries
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM

CHAT = "/v1/chat/completions"
PRICES = {"fake-model": {"prompt_per_1k": 1, "completion_per_1k": 2, "context_tokens": 4096}}


@pytest.fixture
def billed(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path),
        "credits.sqlite_synchronous": "NORMAL", "credits.models": PRICES, "cache.enabled": False,
    })
    with ProxyServer(settings) as server:
        yield server


def _key(server: ProxyServer, user: str, micro: int) -> str:
    created = server.call(server.runtime.credits.keys.create(user, "acme"))  # type: ignore[union-attr]
    server.call(server.runtime.credits.store.top_up(user, micro, tenant="acme"))  # type: ignore[union-attr]
    return str(created.plaintext)


def _charges(server: ProxyServer, user: str) -> list[LedgerEntry]:
    async def read() -> list[LedgerEntry]:
        store = server.runtime.credits.store
        assert store is not None
        return [e async for e in ledger_entries(store, LedgerFilter(user=user, kind="charge"))]

    return list(server.call(read()))


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def _body(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": question}], "max_tokens": 50, **extra}


async def test_concurrent_calls_under_one_request_id_are_each_charged_and_never_more_served_than_paid(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    fake_llm_thread.latency_s = 2.0  # every call arrives while the first five are still held
    probe = _body("question 0")
    worst = billed.runtime.credits.prices.worst_case(probe, raw_size=len(httpx.Request("POST", "/", json=probe)
                                                                         .content))
    balance = 5 * worst + worst // 2  # holds five reservations at once, not six
    key = _key(billed, "ann", balance)
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": "same-id-for-all"}
    async with httpx.AsyncClient(base_url=billed.url, timeout=30, headers=headers) as client:
        replies = await asyncio.gather(*(client.post(CHAT, json=_body(f"question {n}")) for n in range(100)))
    served = [r for r in replies if r.status_code == 200]
    assert {r.status_code for r in replies} <= {200, 429}
    assert all(r.headers["X-Request-ID"] == "same-id-for-all" for r in replies), "still echoed for tracing"
    charges = _charges(billed, "ann")
    assert len(served) == len(charges) == fake_llm_thread.log.count(CHAT)
    assert sorted(e.request_id for e in charges) == sorted(r.headers["X-Credits-Request-ID"] for r in served)
    assert 1 <= len(served) <= 5, "at most what the balance could reserve at once"
    assert sum(e.cost for e in charges) <= balance


def test_a_stream_abandoned_after_24_of_26_pieces_is_charged_what_was_produced(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    fake_llm_thread.answer = lambda prompt: " ".join(f"w{n}" for n in range(26))
    fake_llm_thread.chunk_latency_s = 0.05
    key = _key(billed, "ann", 100 * MICRO)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=0)
    stream = client.chat.completions.create(**_body("tell me a long story", max_tokens=100), stream=True)
    pieces = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            if pieces == 24:
                break
    stream.close()  # hang up before the last two pieces
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while not (charges := _charges(billed, "ann")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [charge] = charges
    assert charge.usage_source == "relayed"
    assert 24 <= charge.completion_tokens <= 26
    assert 5 <= charge.prompt_tokens <= 8, "an estimate of the 5 words sent (it used to be the body's 100 bytes)"
    assert charge.cost > 0
    account = billed.call(billed.runtime.credits.store.balance("ann"))  # type: ignore[union-attr]
    assert account.held == 0 and account.available == 100 * MICRO - charge.cost


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_before_the_answer_starts_is_charged_the_prompt_the_upstream_had(
        fake_llm_thread: FakeLLM, billed: ProxyServer, stream: bool) -> None:
    """The reservation used to be released: the upstream had processed the prompt, and nothing was charged."""
    fake_llm_thread.latency_s = 2.0
    key = _key(billed, "ann", 100 * MICRO)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(billed.url + CHAT, json=_body("how tall is the tower", stream=stream), timeout=0.6,
                   headers={"Authorization": f"Bearer {key}"})
    _until(lambda: len(_charges(billed, "ann")) == 1)
    [charge] = _charges(billed, "ann")
    assert (charge.usage_source, charge.completion_tokens) == ("relayed", 0)
    assert 5 <= charge.prompt_tokens <= 8 and charge.cost > 0
    assert fake_llm_thread.log.count(CHAT) == 1
    account = billed.call(billed.runtime.credits.store.balance("ann"))  # type: ignore[union-attr]
    assert account.held == 0 and account.available == 100 * MICRO - charge.cost


def test_a_stream_the_upstream_breaks_off_is_not_charged(fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    key = _key(billed, "ann", 100 * MICRO)
    fake_llm_thread.faults.reset_after(3)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(**_body("a broken story"), stream=True):
            pass
    store = billed.runtime.credits.store
    _until(lambda: billed.call(store.balance("ann")).held == 0)  # type: ignore[union-attr]  # settled or released
    assert _charges(billed, "ann") == []
    account = billed.call(store.balance("ann"))  # type: ignore[union-attr]
    assert account.available == 100 * MICRO


def test_a_repeated_idempotency_key_gets_the_first_answer_and_is_charged_once(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    key = _key(billed, "ann", 100 * MICRO)
    # the SDK's own retries: a repeat sent before the first answer was kept (after it went out) gets a 409 with
    # Retry-After, which the SDK retries by default
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=2)
    calls = [client.chat.completions.with_raw_response.create(
        **_body("charge me once"), extra_headers={"Idempotency-Key": "order-17"}) for _ in range(3)]
    first, *repeats = calls
    assert "Idempotent-Replayed" not in first.headers
    assert first.headers["X-Credits-Charged"] != "0"
    for repeat in repeats:
        assert repeat.headers["Idempotent-Replayed"] == "true"
        assert repeat.parse().model_dump() == first.parse().model_dump()
        assert repeat.headers["X-Credits-Request-ID"] == first.headers["X-Credits-Request-ID"]
        assert repeat.headers["X-Credits-Charged"] == "0", "charged now: nothing (it used to repeat the first's)"
        assert "X-Credits-Remaining" not in repeat.headers, "the first one's balance is not this one's"
    assert fake_llm_thread.log.count(CHAT) == 1
    assert len(_charges(billed, "ann")) == 1
    streamed = [client.chat.completions.create(**_body("stream me once"), stream=True,
                                               extra_headers={"Idempotency-Key": "order-18"}) for _ in range(2)]
    texts = ["".join(c.choices[0].delta.content or "" for c in s if c.choices) for s in streamed]
    assert texts[0] == texts[1] != ""
    assert fake_llm_thread.log.count(CHAT) == 2 and len(_charges(billed, "ann")) == 2


def test_an_idempotency_key_is_tied_to_its_request_and_scoped_per_user(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    ann, bob = _key(billed, "ann", 100 * MICRO), _key(billed, "bob", 100 * MICRO)

    def post(api_key: str, question: str) -> httpx.Response:
        return httpx.post(billed.url + CHAT, json=_body(question), timeout=30,
                          headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": "k1"})

    assert post(ann, "first").status_code == 200
    reused = post(ann, "another question")
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert post(bob, "another question").status_code == 200, "another user's k1 is another key"
    invalid = httpx.post(billed.url + CHAT, json=_body("x"), timeout=30,
                         headers={"Authorization": f"Bearer {ann}", "Idempotency-Key": "x" * 256})
    assert invalid.status_code == 400 and invalid.json()["error"]["code"] == "invalid_idempotency_key"


async def test_a_repeat_while_the_first_runs_is_409_and_a_failed_first_frees_the_key(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    key = _key(billed, "ann", 100 * MICRO)
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "slow"}
    fake_llm_thread.latency_s = 2.0
    async with httpx.AsyncClient(base_url=billed.url, timeout=30, headers=headers) as client:
        first = asyncio.ensure_future(client.post(CHAT, json=_body("slow one")))
        await asyncio.to_thread(_until, lambda: fake_llm_thread.log.count(CHAT) > 0)  # upstream: its key is held
        busy = await client.post(CHAT, json=_body("slow one"))
        assert busy.status_code == 409 and busy.headers["Retry-After"] == "1"
        assert (await first).status_code == 200
        fake_llm_thread.latency_s = 0.0
        fake_llm_thread.faults.fail_next(500)
        failing = {**headers, "Idempotency-Key": "fails-once"}
        assert (await client.post(CHAT, json=_body("retry me"), headers=failing)).status_code == 500
        retried = await client.post(CHAT, json=_body("retry me"), headers=failing)
        assert retried.status_code == 200 and "Idempotent-Replayed" not in retried.headers
    assert fake_llm_thread.log.count(CHAT) == 3


def test_an_abandoned_responses_stream_is_charged_what_was_produced(
        fake_llm_thread: FakeLLM, billed: ProxyServer) -> None:
    fake_llm_thread.answer = lambda prompt: " ".join(f"w{n}" for n in range(26))
    fake_llm_thread.chunk_latency_s = 0.05
    key = _key(billed, "ann", 100 * MICRO)
    client = openai.OpenAI(base_url=billed.url + "/v1", api_key=key, max_retries=0)
    stream = client.responses.create(model="fake-model", input="tell me a long story", stream=True)
    pieces = 0
    for event in stream:
        if event.type == "response.output_text.delta":
            pieces += 1
            if pieces == 10:
                break
    stream.close()
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while not (charges := _charges(billed, "ann")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [charge] = charges
    assert charge.usage_source == "relayed" and 10 <= charge.completion_tokens <= 26


def test_one_user_s_flood_of_keys_does_not_make_another_user_s_retries_pay_again(
        fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    """Embedded mode kept one LRU of keys for every user: once ann had sent more keys than it held, bob's retries
    (finished and in flight) ran, and were charged, again."""
    settings = proxy_settings(fake_llm_thread.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path), "cache.enabled": False,
        "credits.sqlite_synchronous": "NORMAL", "credits.models": PRICES, "idempotency.max_entries": 40})
    with ProxyServer(settings) as server:
        ann, bob = _key(server, "ann", 100 * MICRO), _key(server, "bob", 100 * MICRO)

        def post(api_key: str, key: str, timeout: float = 30) -> httpx.Response:
            return httpx.post(server.url + CHAT, json=_body(f"question {key}"), timeout=timeout,
                              headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key})

        assert post(bob, "bob-done").status_code == 200
        fake_llm_thread.latency_s = 4.0
        running = threading.Thread(target=post, args=(bob, "bob-running"))
        running.start()
        _until(lambda: fake_llm_thread.log.count(CHAT) == 2)
        fake_llm_thread.latency_s = 0.0
        for n in range(60):
            assert post(ann, f"ann-{n}").status_code == 200
        retried = post(bob, "bob-running")  # 409 while it runs; its answer once it has finished (a loaded machine)
        assert retried.status_code == 409 or retried.headers.get("Idempotent-Replayed") == "true", "not run twice"
        done = post(bob, "bob-done")
        assert done.status_code == 200 and done.headers["Idempotent-Replayed"] == "true"
        running.join()
        assert fake_llm_thread.log.count(CHAT) == 62 and len(_charges(server, "bob")) == 2


@pytest.fixture
def caching_billed(fake_llm_thread: FakeLLM, tmp_path: Path) -> Iterator[ProxyServer]:
    settings = proxy_settings(fake_llm_thread.url, **{
        "auth.mode": "keys", "credits.enabled": True, "data_dir": str(tmp_path),
        "credits.sqlite_synchronous": "NORMAL", "credits.models": PRICES})
    with ProxyServer(settings) as server:
        yield server


async def test_coalesced_misses_on_a_balance_for_one_miss_are_each_charged_and_never_overdrawn(
        fake_llm_thread: FakeLLM, caching_billed: ProxyServer) -> None:
    """The caches answer before a miss reserves: 20 identical concurrent requests on a balance that holds one worst
    case make one upstream call, its leader charged the upstream's price and each follower the coalesced price (held
    before it is sent: never more served than paid), streamed or not."""
    fake_llm_thread.latency_s = 0.5
    body = _body("coalesce on a thin balance")
    worst = caching_billed.runtime.credits.prices.worst_case(body, raw_size=len(httpx.Request("POST", "/", json=body)
                                                                              .content))
    key = _key(caching_billed, "cora", worst + worst // 2)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=caching_billed.url, timeout=30, headers=headers) as client:
        replies = await asyncio.gather(*(client.post(CHAT, json={**body, "stream": n % 2 == 1}) for n in range(20)))
    served = [r for r in replies if r.status_code == 200]
    assert {r.status_code for r in replies} <= {200, 429}
    assert fake_llm_thread.log.count(CHAT) == 1, "one upstream call"
    _until(lambda: len(_charges(caching_billed, "cora")) == len(served))
    charges = _charges(caching_billed, "cora")
    assert sorted(e.request_id for e in charges) == sorted(r.headers["X-Credits-Request-ID"] for r in served)
    assert [e.tier for e in charges].count("upstream") == 1
    account = caching_billed.call(caching_billed.runtime.credits.store.balance("cora"))  # type: ignore[union-attr]
    assert account.held == 0 and account.available >= 0
    assert sum(e.cost for e in charges) <= worst + worst // 2


def test_a_hit_stream_abandoned_is_charged_at_most_its_price_and_holds_nothing(
        fake_llm_thread: FakeLLM, caching_billed: ProxyServer) -> None:
    fake_llm_thread.answer = lambda prompt: " ".join(f"w{n}" for n in range(400))
    key = _key(caching_billed, "dina", 100 * MICRO)
    client = openai.OpenAI(base_url=caching_billed.url + "/v1", api_key=key, max_retries=0)
    body = _body("a long cached story", max_tokens=1000)
    client.chat.completions.create(**body)
    full_hit = float(client.chat.completions.with_raw_response.create(**body).headers["X-Credits-Charged"])
    stream = client.chat.completions.create(**body, stream=True)
    next(iter(stream))
    stream.close()
    _until(lambda: len(_charges(caching_billed, "dina")) == 3)
    hang_up = _charges(caching_billed, "dina")[-1]
    assert hang_up.tier == "l1" and 0 < hang_up.cost <= full_hit * MICRO + 1
    assert caching_billed.call(caching_billed.runtime.credits.store.balance("dina")).held == 0  # type: ignore[union-attr]
