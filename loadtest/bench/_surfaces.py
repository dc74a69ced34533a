"""The ``abuse`` benchmark's attacks on the surfaces added after its first version: rerankers, the Responses API,
idempotency keys under eviction and across a Redis restart, clients hanging up before the response head.

Each attack is an async function that sends its requests through :func:`loadtest.bench._tally.send` (so every one
is counted) and returns what it saw. The set-up (replicas, upstreams, keys) is :mod:`loadtest.bench.abuse`'s.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

from loadtest.bench._tally import CHAT, RESPONSES, Tally, chat, send

RERANK = "/v1/rerank"


def malformed_inputs() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of bodies of the wrong types that no upstream accepts: each must be a 4xx."""
    documents = ["the tower is 330 metres tall", "paris is in france"]
    return [
        ("rerank_documents_not_strings", RERANK, {"model": "fake-reranker", "query": "q", "documents": [1, 2]}),
        ("rerank_top_n_not_a_number", RERANK, {"model": "fake-reranker", "query": "q", "documents": documents,
                                               "top_n": "x"}),
        ("score_text_2_not_strings", "/v1/score", {"model": "fake-reranker", "text_1": "q", "text_2": [1.5]}),
        ("responses_input_of_numbers", RESPONSES, {"model": "fake-model", "input": [1]}),
        ("responses_tools_a_string", RESPONSES, {"model": "fake-model", "input": "hi", "tools": "junk"}),
        ("chat_tools_a_string", CHAT, {**chat("hi"), "tools": "junk"}),
        *[(f"{path.strip('/').replace('/', '_')}_document_{name}", path,
           {"model": "fake-reranker", "query": "q", "documents": [document]})
          for path in (RERANK, "/v2/rerank")
          for name, document in (("text_a_number", {"text": 5}), ("empty_object", {}), ("content_a_string",
                                                                                         {"content": "x"}))],
        ("responses_text_a_number", RESPONSES, {"model": "fake-model", "input": "hi", "text": 5}),
        ("responses_reasoning_a_string", RESPONSES, {"model": "fake-model", "input": "hi", "reasoning": "high"}),
        ("responses_previous_response_id_a_list", RESPONSES, {"model": "fake-model", "input": "hi",
                                                              "previous_response_id": ["a"]}),
        ("responses_message_content_a_number", RESPONSES, {"model": "fake-model",
                                                           "input": [{"role": "user", "content": 5}]}),
    ]


async def malformed(url: str, headers: dict[str, str], tally: Tally) -> dict[str, int | None]:
    seen: dict[str, int | None] = {}
    async with httpx.AsyncClient(headers=headers) as client:
        for name, path, body in malformed_inputs():
            response = await send(client, tally, "malformed_bodies", "POST", url + path, json=body)
            seen[name] = response.status_code if response is not None else None
    return seen


PROBE_INTERVAL_S = 0.005


Sample = tuple[float, float, bool]
"""A probe: when it was due, the seconds from then to its answer (or its failure), whether it was answered."""


async def _probes(host: str, port: int, stop: Any) -> list[Sample]:
    """One ``GET /healthz`` due every ``PROBE_INTERVAL_S``, each on an idle keep-alive connection (a new one when
    every connection is busy), so that a slow probe never holds back the next (30 s at most each)."""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    samples: list[Sample] = []

    async def one(due: float) -> None:
        try:
            reader, writer = idle.pop() if idle else await asyncio.open_connection(host, port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            samples.append((due, time.monotonic() - due, True))
            idle.append((reader, writer))
        except (OSError, asyncio.IncompleteReadError, TimeoutError, StopIteration):
            samples.append((due, time.monotonic() - due, False))

    pending: set[asyncio.Task[None]] = set()
    due = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        task = asyncio.ensure_future(one(due))
        pending.add(task)
        task.add_done_callback(pending.discard)
        due += PROBE_INTERVAL_S
    if pending:
        await asyncio.wait(pending, timeout=30)
    for _, writer in idle:
        writer.close()
    return samples


def _probe_health(url: str, stop: Any, out: Any) -> None:
    """Child process: :func:`_probes` against ``url`` until ``stop`` is set; puts the samples on ``out``."""
    parts = urlsplit(url)
    out.put(asyncio.run(_probes(parts.hostname or "127.0.0.1", parts.port or 80, stop)))


class HealthProbe:
    """``GET /healthz`` every ``PROBE_INTERVAL_S`` against ``url`` from a process of its own, so that nothing in the
    caller's process (the upstream doubles answering a large request) delays it, from :meth:`start` until
    :meth:`samples`. Probes are timed from when they were due: a stall of the proxy delays every probe due during
    it, and each one counts."""

    def __init__(self, url: str) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._stop, self._out = spawn.Event(), spawn.Queue()
        self._process = spawn.Process(target=_probe_health, args=(url, self._stop, self._out), daemon=True)

    def start(self) -> None:
        self._process.start()

    def samples(self, timeout_s: float = 60.0) -> list[Sample]:
        """Stop probing; every probe sent (those still out are waited for, 30 s at most each)."""
        self._stop.set()
        samples: list[Sample] = self._out.get(True, timeout_s)
        self._process.join(10)
        return samples


def _ms(samples: list[float], q: float) -> float | None:
    """The ``q``-th percentile in milliseconds (a failed probe counts with the time it took to fail)."""
    return round(float(np.percentile(np.asarray(samples) * 1000, q)), 2) if samples else None


def _documents(count: int, salt: str) -> bytes:
    """A rerank body of ``count`` distinct documents (``salt`` makes them distinct from every other body's)."""
    return orjson.dumps({"model": "fake-reranker", "query": "which passage is about the tower",
                         "documents": [f"passage {n} {salt} about topic {n % 97} and the tower" for n in range(count)]})


def _phase(samples: list[Sample], spans: list[tuple[float, float]], before: list[float]) -> dict[str, Any]:
    """Probe latencies due during ``spans``, against those ``before``."""
    during = [s for at, s, _ in samples if any(start <= at < end for start, end in spans)]
    p99_before, p99_during = _ms(before, 99), _ms(during, 99)
    return {"probes": len(during), "probe_p50_ms": _ms(during, 50), "probe_p99_ms": p99_during,
            "probe_max_ms": _ms(during, 100),
            "probe_p99_ratio": round(p99_during / p99_before, 2) if p99_before and p99_during else None}


async def rerank_flood(default_url: str, raised_url: str, headers: dict[str, str], raised_headers: dict[str, str],
                       tally: Tally, documents: int, at_limit: int = 10_000, repeats: int = 5,
                       baseline_s: float = 3.0) -> dict[str, Any]:
    """``documents`` distinct documents in one ``/v1/rerank``: refused at the default limit (``default_url``); then,
    with the cache on and the limit raised (``raised_url``), ``repeats`` requests of ``at_limit`` documents (the
    most the default limit accepts) one after the other, and one of ``documents``, while a probe process times
    ``GET /healthz`` there: its p99 during each phase against its p99 in the ``baseline_s`` before."""
    seen: dict[str, Any] = {"documents": documents}
    async with httpx.AsyncClient(headers={**headers, "Content-Type": "application/json"}) as client:
        started = time.monotonic()
        response = await send(client, tally, "rerank_flood", "POST", default_url + RERANK,
                              content=_documents(documents, "refused"))
        seen["default_limit"] = {"status": response.status_code if response is not None else None,
                                 "seconds": round(time.monotonic() - started, 2)}
    bodies = [_documents(at_limit, f"flood {n}") for n in range(repeats)]
    big = _documents(documents, "raised")
    prober = HealthProbe(raised_url)
    prober.start()
    spans: dict[str, list[tuple[float, float]]] = {"at_limit": [], "raised": []}
    statuses: list[int | None] = []
    try:
        await asyncio.sleep(baseline_s)
        first = time.monotonic()
        async with httpx.AsyncClient(headers={**raised_headers, "Content-Type": "application/json"}) as client:
            for phase, body in [*(("at_limit", b) for b in bodies), ("raised", big)]:
                started = time.monotonic()
                response = await send(client, tally, "rerank_flood", "POST", raised_url + RERANK, content=body)
                spans[phase].append((started, time.monotonic()))
                statuses.append(response.status_code if response is not None else None)
                await asyncio.sleep(0.5)
    finally:
        samples = await asyncio.to_thread(prober.samples)
    before = [s for at, s, _ in samples if at < first]
    seen["probe_before"] = {"probes": len(before), "probe_p50_ms": _ms(before, 50), "probe_p99_ms": _ms(before, 99),
                            "probe_max_ms": _ms(before, 100)}
    seen["at_limit"] = {"documents": at_limit, "requests": repeats, "statuses": statuses[:-1],
                        "seconds": [round(end - start, 2) for start, end in spans["at_limit"]],
                        **_phase(samples, spans["at_limit"], before)}
    start, end = spans["raised"][0]
    seen["raised_limit"] = {"status": statuses[-1], "seconds": round(end - start, 2),
                            **_phase(samples, spans["raised"], before)}
    seen["probe_failures"] = sum(1 for _, _, answered in samples if not answered)
    return seen


async def cross_tenant_responses(url: str, owner: dict[str, str], other: dict[str, str], tally: Tally) -> dict[str,
                                                                                                           Any]:
    """Tenant A stores a response; tenant B, given its id, reads it (``GET /v1/responses/{id}``) and continues it
    (``previous_response_id``). Each 2xx is a cross-tenant read."""
    seen: dict[str, Any] = {}
    async with httpx.AsyncClient() as client:
        created = await send(client, tally, "cross_tenant_responses", "POST", url + RESPONSES, headers=owner,
                             json={"model": "fake-model", "store": True, "input": "tenant A's private question"})
        if created is None or not created.is_success:
            return {"created": created.status_code if created is not None else None}
        response_id = created.json()["id"]
        read = await send(client, tally, "cross_tenant_responses", "GET", f"{url}{RESPONSES}/{response_id}",
                          headers=other)
        continued = await send(client, tally, "cross_tenant_responses", "POST", url + RESPONSES, headers=other,
                               json={"model": "fake-model", "previous_response_id": response_id,
                                     "input": "what did I ask before?"})
    for name, response in (("get_by_id", read), ("previous_response_id", continued)):
        status = response.status_code if response is not None else None
        seen[name] = status
        tally.cross_tenant_reads += int(response is not None and response.is_success)
    return seen


async def idempotency_under_eviction(url: str, victim: dict[str, str], flooder: dict[str, str], tally: Tally,
                                     set_latency: Callable[[float], None], upstream_calls: Callable[[], int],
                                     flood: int) -> dict[str, Any]:
    """The victim has a finished key and one whose call still runs; the flooder sends ``flood`` keys, more than the
    store holds; then the victim retries both. A retry that runs again (a second ledger id) is a double charge."""
    seen: dict[str, Any] = {"flood": flood}
    async with httpx.AsyncClient(headers=victim) as client:
        await send(client, tally, "idempotency_eviction", "POST", url + CHAT, key="victim-done",
                   json=chat("the victim's finished question"))
        set_latency(4.0)
        calls = upstream_calls()
        running = asyncio.ensure_future(send(client, tally, "idempotency_eviction", "POST", url + CHAT,
                                             key="victim-running", json=chat("the victim's running question")))
        for _ in range(500):  # until the upstream has it (10 s at most)
            if upstream_calls() > calls:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the upstream took its (long) latency
        set_latency(0.0)
        gate = asyncio.Semaphore(16)
        async with httpx.AsyncClient(headers=flooder) as flooding:

            async def one(n: int) -> None:
                async with gate:
                    await send(flooding, tally, "idempotency_flood", "POST", url + CHAT, key=f"flood-{n}",
                               json=chat(f"flood question {n}"))

            await asyncio.gather(*(one(n) for n in range(flood)))
        retried = await send(client, tally, "idempotency_eviction", "POST", url + CHAT, key="victim-running",
                             json=chat("the victim's running question"))
        done = await send(client, tally, "idempotency_eviction", "POST", url + CHAT, key="victim-done",
                          json=chat("the victim's finished question"))
        first = await running
    seen["running_retry"] = retried.status_code if retried is not None else None
    seen["finished_retry_replayed"] = done is not None and done.headers.get("Idempotent-Replayed") == "true"
    seen["running_first"] = first.status_code if first is not None else None
    return seen


async def redis_restart(urls: list[str], admin_url: str, headers: dict[str, str], tally: Tally,
                        restart: Callable[[], None], calls: int) -> dict[str, Any]:
    """``calls`` keyed calls (concurrent, so the replicas' Redis pools hold many connections); Redis restarted
    (from its append-only file) while as many new keyed calls arrive; then every key retried on the other replica,
    and the admin API used. Nothing may fail; every retry must be replayed."""

    async def keyed(client: httpx.AsyncClient, numbers: range, replica: int) -> list[httpx.Response | None]:
        return await asyncio.gather(*(send(client, tally, "redis_restart", "POST", urls[(n + replica) % len(urls)]
                                           + CHAT, key=f"restart-{n}", json=chat(f"restart question {n}"))
                                      for n in numbers))

    async with httpx.AsyncClient(headers=headers) as client:
        await keyed(client, range(calls), 0)
        during = asyncio.ensure_future(keyed(client, range(calls, 2 * calls), 0))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.to_thread(restart)
        down_s = time.monotonic() - started
        await during
        retried = await keyed(client, range(2 * calls), 1)
        async with httpx.AsyncClient(base_url=admin_url) as admin:
            await send(admin, tally, "redis_restart_admin", "POST", admin_url + "/admin/keys",
                       json={"user": "after-restart", "tenant": "abuse-tenant"})
            await send(admin, tally, "redis_restart_admin", "GET", admin_url + "/admin/credits/abuse-user")
    replayed = sum(1 for r in retried if r is not None and r.headers.get("Idempotent-Replayed") == "true")
    return {"keys": 2 * calls, "retries_replayed": replayed, "restart_s": round(down_s, 2)}


async def hang_ups(url: str, headers: dict[str, str], tally: Tally, set_latency: Callable[[float], None],
                   per_kind: int) -> dict[str, int]:
    """Clients that hang up before the response head (the upstream is slow to answer), streamed and not: each must
    still be charged for the prompt the upstream received (checked by the unbilled-calls figure)."""
    set_latency(1.0)
    hung: dict[str, int] = {"stream": 0, "complete": 0}
    try:
        async with httpx.AsyncClient(headers=headers) as client:
            for n in range(per_kind):
                for stream in (False, True):
                    tally.requests += 1
                    try:
                        await client.post(url + CHAT, json=chat(f"hang up {n} {stream}", stream=stream), timeout=0.3)
                    except httpx.TimeoutException:
                        hung["stream" if stream else "complete"] += 1
    finally:
        set_latency(0.0)
    return hung
