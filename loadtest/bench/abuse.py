"""Abuse: what an outsider can get for free, leave unanswered or knock over, against two ``ragproxy serve`` replicas.

``python -m loadtest.bench abuse [--quick] [--json] [--slow-connections N] [--fd-limit N] [--attack-s S]``, from the
repository root (the upstream doubles are imported from ``proxy.doubles``).

Set-up, all on loopback: a redis-server this run owns; the fake LLM and the TEST-ONLY Qdrant shim (``proxy.doubles``,
in this process, so every upstream call is counted); two ``ragproxy serve`` processes on that Redis with API keys,
credits and no response caching (every call goes upstream, so each must be charged once). One API key with a
large balance, made through the admin API.

Scenarios, in order:

1. **same-id reuse**: calls with distinct prompts under one ``X-Request-ID``, 6 at a time, alternating replicas;
2. **abandoned streams**: streams read for a few pieces, then hung up on;
3. **idempotent repeats**: each ``Idempotency-Key`` sent three times with one body (one upstream call, one charge
   expected per key) and once with another body (422 expected);
4. **oversize and deep inputs**: embeddings of 20,000 and 100,000 items, 1,000-deep tool parameters and content
   parts, an 800-deep Qdrant filter, a 100-deep prefetch, a 10,000-search batch, batches of non-objects, 5,000
   structured documents (a bounded ``X-Prefix-Docs``);
5. **slow connections**: replica A's descriptors limited to ``--fd-limit`` (soft and hard, ``prlimit``), then
   ``--slow-connections`` connections each trickling one byte of a request head every 5 s for ``--attack-s``, while
   a probe (``GET /healthz`` and one small chat call) runs every 0.5 s against A. The probe's latency before the
   attack is the baseline of its latency during the attack.

Figures (the last line with ``--json`` is one JSON object): ``requests`` (every request sent that expects an answer,
probes included), ``unbilled_upstream_calls`` (upstream LLM calls beyond the ledger's charges for them),
``answers_without_charge`` (2xx answers whose ``X-Credits-Request-ID`` is not in the ledger),
``unanswered_requests`` (no HTTP answer within 60 s), ``server_errors`` (5xx), ``probe_failures``, and per scenario
the statuses seen. No timings are asserted; this is a command that prints what happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadtest.harness import free_port, ledger_charges, listening, proxy_child

USER, TENANT = "abuse-user", "abuse-tenant"
CHAT, EMBEDDINGS = "/v1/chat/completions", "/v1/embeddings"
LLM_PATHS = (CHAT, EMBEDDINGS)
ANSWER_TIMEOUT_S = 60.0


@dataclass
class Tally:
    """Every request sent and how it ended, per scenario."""

    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    ledger_ids: list[str] = field(default_factory=list)
    requests: int = 0
    unanswered: int = 0
    server_errors: int = 0

    def seen(self, scenario: str, response: httpx.Response | None) -> None:
        self.requests += 1
        status = "no answer" if response is None else str(response.status_code)
        self.statuses.setdefault(scenario, Counter())[status] += 1
        if response is None:
            self.unanswered += 1
        elif response.status_code >= 500:
            self.server_errors += 1
        elif response.is_success and "X-Credits-Request-ID" in response.headers:
            self.ledger_ids.append(response.headers["X-Credits-Request-ID"])


async def send(client: httpx.AsyncClient, tally: Tally, scenario: str, method: str, url: str,
               **kwargs: Any) -> httpx.Response | None:
    try:
        response = await client.request(method, url, timeout=ANSWER_TIMEOUT_S, **kwargs)
    except httpx.HTTPError:
        response = None
    tally.seen(scenario, response)
    return response


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 32, "messages": [{"role": "user", "content": question}], **extra}


async def same_id_reuse(urls: list[str], headers: dict[str, str], tally: Tally, calls: int) -> None:
    gate = asyncio.Semaphore(6)
    reused = {**headers, "X-Request-ID": "abuse-same-id"}
    async with httpx.AsyncClient(headers=reused) as client:

        async def one(n: int) -> None:
            async with gate:
                await send(client, tally, "same_id_reuse", "POST", urls[n % len(urls)] + CHAT,
                           json=chat(f"reused id question {n}"))

        await asyncio.gather(*(one(n) for n in range(calls)))


async def abandoned_streams(urls: list[str], headers: dict[str, str], tally: Tally, streams: int) -> None:
    async with httpx.AsyncClient(headers=headers, timeout=ANSWER_TIMEOUT_S) as client:
        for n in range(streams):
            body = chat(f"tell a long story number {n} " + "and more " * 12, max_tokens=64, stream=True)
            tally.requests += 1
            try:
                async with client.stream("POST", urls[n % len(urls)] + CHAT, json=body) as response:
                    status = response.status_code
                    pieces = 0
                    async for line in response.aiter_lines():
                        if line.startswith("data: {") and '"content"' in line:
                            pieces += 1
                            if pieces >= 5 + n % 10:
                                break  # hang up mid-stream
                    if response.is_success and "X-Credits-Request-ID" in response.headers:
                        tally.ledger_ids.append(response.headers["X-Credits-Request-ID"])
            except httpx.HTTPError:
                status = 0
                tally.unanswered += 1
            tally.server_errors += int(status >= 500)
            tally.statuses.setdefault("abandoned_streams", Counter())[str(status or "no answer")] += 1


async def idempotent_repeats(urls: list[str], headers: dict[str, str], tally: Tally, keys: int) -> None:
    async with httpx.AsyncClient(headers=headers) as client:
        for n in range(keys):
            keyed = {"Idempotency-Key": f"abuse-key-{n}"}
            for attempt in range(3):
                await send(client, tally, "idempotent_repeats", "POST", urls[attempt % len(urls)] + CHAT,
                           json=chat(f"keyed question {n}"), headers=keyed)
            await send(client, tally, "idempotent_other_body", "POST", urls[0] + CHAT,
                       json=chat(f"another keyed question {n}"), headers=keyed)


def _nested(depth: int, leaf: str) -> str:
    return '{"a":' * depth + leaf + "}" * depth


def oversize_inputs(quick: bool) -> list[tuple[str, str, str, bytes]]:
    """(name, method, path, body) of each outsized or overly deep request."""
    deep = _nested(1000, '"x"')
    prefetch: dict[str, Any] = {"query": [1.0, 0.0, 0.5, 0.25], "limit": 3}
    for _ in range(100):
        prefetch = {"prefetch": prefetch, "query": [1.0, 0.0, 0.5, 0.25], "limit": 3}
    search = "/collections/abuse/points/search"
    documents = [{"id": f"doc-{n}", "text": f"passage {n} about the topic"} for n in range(5000)]
    inputs = [
        ("embeddings_20000", "POST", EMBEDDINGS,
         orjson.dumps({"model": "fake-model", "input": [f"item {n}" for n in range(20_000)]})),
        ("deep_tool_parameters", "POST", CHAT, (
            '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",'
            ' "function": {"name": "f", "parameters": ' + deep + "}}]}").encode()),
        ("deep_content_part", "POST", CHAT, (
            '{"model": "fake-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", '
            '"x": ' + deep + "}]}]}").encode()),
        ("filter_800_deep", "POST", search, ('{"vector": [1, 0, 0.5, 0.25], "filter": ' + '{"must": ' * 800
                                             + '{"key": "a", "match": {"value": 1}}' + "}" * 800 + "}").encode()),
        ("prefetch_100_deep", "POST", "/collections/abuse/points/query", orjson.dumps(prefetch)),
        ("batch_10000", "POST", search + "/batch",
         orjson.dumps({"searches": [{"vector": [1.0, n, 0.5, 0.25], "limit": 3} for n in range(10_000)]})),
        ("batch_of_a_string", "POST", search + "/batch", b'{"searches": "abc"}'),
        ("batch_of_integers", "POST", search + "/batch", b'{"searches": [1, 2, 3]}'),
        ("documents_5000", "POST", CHAT, orjson.dumps({**chat("what do the documents say?"),
                                                       "ragproxy": {"documents": documents}})),
    ]
    if not quick:
        inputs.insert(1, ("embeddings_100000", "POST", EMBEDDINGS,
                          orjson.dumps({"model": "fake-model", "input": [f"item {n}" for n in range(100_000)]})))
    return inputs


async def oversize(url: str, headers: dict[str, str], tally: Tally, quick: bool) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with httpx.AsyncClient(headers={**headers, "Content-Type": "application/json"}) as client:
        for name, method, path, body in oversize_inputs(quick):
            started = time.monotonic()
            response = await send(client, tally, "oversize_and_deep", method, url + path, content=body)
            seen[name] = {"status": response.status_code if response is not None else None,
                          "seconds": round(time.monotonic() - started, 2)}
    return seen


async def probe(url: str, headers: dict[str, str], until: float, tally: Tally) -> tuple[int, list[float]]:
    """Probe ``/healthz`` and one small chat call every 0.5 s until ``until``: (failures, chat latencies)."""
    failures, latencies = 0, []
    async with httpx.AsyncClient(headers=headers, timeout=5.0) as client:
        n = 0
        while time.monotonic() < until:
            n += 1
            started = time.monotonic()
            for method, path, body in (("GET", "/healthz", None), ("POST", CHAT, chat(f"probe {n}"))):
                tally.requests += 1
                try:
                    response = await client.request(method, url + path, json=body)
                    failures += int(not response.is_success)
                    tally.server_errors += int(response.status_code >= 500)
                    if response.is_success and path == CHAT and "X-Credits-Request-ID" in response.headers:
                        tally.ledger_ids.append(response.headers["X-Credits-Request-ID"])
                except httpx.HTTPError:
                    failures += 1
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    return failures, latencies


async def slow_connections(port: int, count: int, duration_s: float) -> dict[str, int]:
    """``count`` connections trickling a request head one byte every 5 s for ``duration_s``; how they ended."""
    ended: Counter[str] = Counter()
    stop = time.monotonic() + duration_s

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            ended["refused"] += 1
            return
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Slow: ")
            await writer.drain()
            while time.monotonic() < stop:
                try:
                    data = await asyncio.wait_for(reader.read(1024), 5.0)
                except TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
                    continue
                ended["closed by the proxy" if not data else "answered"] += 1
                return
            ended["still open"] += 1
        except OSError:
            ended["reset by the proxy"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return dict(ended)


@contextmanager
def upstreams() -> Iterator[tuple[Any, Any]]:
    """The fake LLM and the Qdrant shim on this process's threads (run from the repository root: they live in
    ``proxy.doubles``), with one small collection."""
    from proxy.doubles.llm_server import FakeLLM
    from proxy.doubles.qdrant_shim import QdrantShim

    with FakeLLM(chunk_latency_s=0.01) as llm, QdrantShim() as shim:
        with httpx.Client(base_url=shim.url, timeout=30) as http:
            http.put("/collections/abuse", json={"vectors": {"size": 4, "distance": "Cosine"}}).raise_for_status()
            http.put("/collections/abuse/points?wait=true", json={"points": [
                {"id": n, "vector": [1.0, float(n), 0.5, 0.25], "payload": {"a": n}} for n in range(20)]})
        yield llm, shim


def _proxy_env(redis_url: str, llm_url: str, qdrant_url: str, data_dir: Path) -> dict[str, str]:
    return {"RAGPROXY_ADMIN__PORT": str(free_port()), "RAGPROXY_REDIS__URL": redis_url,
            "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]), "RAGPROXY_UPSTREAMS__QDRANT__URL": qdrant_url,
            "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "true", "RAGPROXY_CACHE__ENABLED": "false",
            "RAGPROXY_SERVER__MAX_BODY_BYTES": str(64 * 1024 * 1024), "RAGPROXY_DATA_DIR": str(data_dir),
            "RAGPROXY_LOGGING__FORMAT": "text"}


def _settled(admin: httpx.Client, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """The ledger once it stopped growing (abandoned streams settle after the client left)."""
    charges, deadline = ledger_charges(admin, USER), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        again = ledger_charges(admin, USER)
        if len(again) == len(charges):
            return again
        charges = again
    return charges


def run(quick: bool, slow: int, fd_limit: int, attack_s: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ragproxy-abuse-"))
    redis_port = free_port()
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("redis-server is not installed")
    tally = Tally()
    try:
        with ExitStack() as stack:
            stack.enter_context(listening([redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                           "--appendonly", "no"], redis_port))
            llm, shim = stack.enter_context(upstreams())
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            envs = [_proxy_env(redis_url, llm.url, shim.url, work / f"replica-{n}") for n in range(2)]
            replicas = [stack.enter_context(proxy_child(env)) for env in envs]
            urls = [url for url, _ in replicas]
            admin = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{envs[0]['RAGPROXY_ADMIN__PORT']}",
                                                     timeout=30))
            key = admin.post("/admin/keys", json={"user": USER, "tenant": TENANT}).json()["key"]
            admin.post(f"/admin/credits/{USER}", json={"amount": 1_000_000, "tenant": TENANT}).raise_for_status()
            headers = {"Authorization": f"Bearer {key}"}
            timings: dict[str, float] = {}

            async def scenarios() -> dict[str, Any]:
                started = time.monotonic()
                await same_id_reuse(urls, headers, tally, 60 if quick else 150)
                await abandoned_streams(urls, headers, tally, 10 if quick else 30)
                await idempotent_repeats(urls, headers, tally, 5 if quick else 15)
                timings["billing_s"] = time.monotonic() - started
                started = time.monotonic()
                inputs = await oversize(urls[0], headers, tally, quick)
                timings["oversize_s"] = time.monotonic() - started
                _, baseline = await probe(urls[0], headers, time.monotonic() + 5.0, tally)
                resource.prlimit(replicas[0][1].pid, resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
                attack = asyncio.ensure_future(slow_connections(int(urls[0].rsplit(":", 1)[1]), slow, attack_s))
                await asyncio.sleep(min(5.0, attack_s / 4))  # the connections are open
                failures, during = await probe(urls[0], headers, time.monotonic() + attack_s - 5.0, tally)
                return {"oversize_and_deep": inputs, "slow_connections": await attack, "probe_failures": failures,
                        "probe_baseline": baseline, "probe_attacked": during}

            results = asyncio.run(scenarios())
            charges = _settled(admin)
            upstream_calls = sum(llm.log.count(path) for path in LLM_PATHS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _figures(tally, results, charges, upstream_calls, timings, quick, slow, fd_limit, attack_s)


def _p50_ms(samples: list[float]) -> float | None:
    return round(statistics.median(samples) * 1000, 1) if samples else None


def _figures(tally: Tally, results: dict[str, Any], charges: list[dict[str, Any]], upstream_calls: int,
             timings: dict[str, float], quick: bool, slow: int, fd_limit: int, attack_s: float) -> dict[str, Any]:
    upstream_charges = [c for c in charges if c["tier"] == "upstream"]
    charged = {str(c["request_id"]) for c in charges}
    baseline, attacked = _p50_ms(results["probe_baseline"]), _p50_ms(results["probe_attacked"])
    return {
        "benchmark": "abuse", "quick": quick, "requests": tally.requests,
        "unbilled_upstream_calls": max(0, upstream_calls - len(upstream_charges)),
        "upstream_calls": upstream_calls, "ledger_charges": len(charges),
        "answers_without_charge": len(set(tally.ledger_ids) - charged),
        "unanswered_requests": tally.unanswered, "server_errors": tally.server_errors,
        "probe_failures": results["probe_failures"],
        "probe_p50_ms_baseline": baseline, "probe_p50_ms_under_attack": attacked,
        "probe_p50_ratio_to_baseline": round(attacked / baseline, 2) if baseline and attacked else None,
        "relayed_charges": sum(1 for c in charges if c.get("usage_source") == "relayed"),
        "statuses": {name: dict(counts) for name, counts in tally.statuses.items()},
        "oversize_and_deep": results["oversize_and_deep"],
        "slow_connections": {"connections": slow, "fd_limit": fd_limit, "attack_s": attack_s,
                             "ended": results["slow_connections"]},
        "seconds": {name: round(value, 1) for name, value in timings.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench abuse", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, 20,000 items at most (under 3 min)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--slow-connections", type=int, default=None, help="slow connections (300 quick, 600)")
    parser.add_argument("--fd-limit", type=int, default=None, help="replica A's descriptors (256 quick, 512)")
    parser.add_argument("--attack-s", type=float, default=None, help="seconds of slow connections (20 quick, 40)")
    args = parser.parse_args(argv)
    result = run(args.quick, args.slow_connections or (300 if args.quick else 600),
                 args.fd_limit or (256 if args.quick else 512), args.attack_s or (20.0 if args.quick else 40.0))
    for name, value in result.items():
        print(f"{name:>30}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    if args.json:
        print(json.dumps(result))
    return 0
