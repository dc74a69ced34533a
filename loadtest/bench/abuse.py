"""Abuse: what an outsider can get for free, leave unanswered or knock over, against real ``ragproxy serve`` replicas.

``python -m loadtest.bench abuse [--quick] [--json] [--slow-connections N] [--fd-limit N] [--attack-s S]
[--rerank-documents N] [--proxy-tree DIR]`` (the upstream doubles come from ``upstream_doubles``; ``--proxy-tree``:
run the ``ragproxy serve`` processes from another checkout, e.g. main's, with this tree's attacks).

Set-up, all on loopback: a redis-server this run owns (append-only file, fsync always: it is restarted mid-run);
the fake LLM reading requests as common stacks do (:class:`~upstream_doubles.lenient_llm.LenientFakeLLM`: the path
decoded twice, ``;`` parameters dropped, ``X-Original-URL`` and method overrides honoured, JSON read leniently), the
TEST-ONLY Qdrant shim and a fake vLLM reranker (``upstream_doubles``, in this process, so every upstream call is
counted); four ``ragproxy serve`` processes with API keys and credits:

* **A** and **B** share the Redis (shared mode), response caching off (every call goes upstream, so each must be
  charged once), idempotency keys capped at 50 per user;
* **E** is embedded (keys, credits and idempotency keys in its own process), caching off, its idempotency store
  bounded at ``--flood`` / 2 keys in all;
* **R** is embedded in front of the reranker with caching on and ``limits.rerank_documents`` raised to
  ``--rerank-documents``.

Scenarios, in order:

1. **same-id reuse**: calls with distinct prompts under one ``X-Request-ID``, 6 at a time, alternating A and B;
2. **abandoned streams**: streams read for a few pieces, then hung up on;
3. **idempotent repeats**: each ``Idempotency-Key`` sent three times with one body (one upstream call, one charge
   expected per key) and once with another body (422 expected);
4. **hang-ups before the head**: the upstream slowed to 1 s, clients hang up after 0.3 s, streamed and not (the
   upstream had the prompt: each must be charged);
5. **malformed bodies** of wrong types (reranker documents, document objects and ``top_n``, ``/v1/score`` pairs,
   Responses ``input``, ``tools``, ``text``, ``reasoning`` and ``previous_response_id``, chat ``tools``): a 4xx
   each, nothing forwarded;
6. **cross-tenant Responses**: tenant A stores a response; tenant B reads it by id and continues it with
   ``previous_response_id`` (each 2xx is a cross-tenant read); then **the rows attacked** (:mod:`._abuse_rows`:
   every row of :data:`proxy.core.endpoints.ROWS` at each of its paths, and each ``upstreams.llm_passthrough``
   pattern, with no scenario of its own): every path with every climb some server resolves (``%252e``, ``..;``,
   ``%c0%ae``...) towards every other row, as a user without credits and, towards A's stored response, as tenant B
   (:mod:`._abuse_paths`); every row with every override and forwarding header (:mod:`._abuse_headers`); every
   row that takes a body with every content type and every body a lenient parser reads otherwise, carrying A's ids
   (:mod:`._abuse_bodies`);
7. **idempotency under eviction** (E): a victim with a finished key and a running one; another user floods more
   keys than E holds; the victim retries both;
8. **Redis restart** (A, B): keyed calls, Redis restarted while more arrive, every key retried on the other replica,
   the admin API used;
9. **oversize and deep inputs**: embeddings of 20,000 and 100,000 items, 1,000-deep tool parameters and content
   parts, an 800-deep Qdrant filter, a 100-deep prefetch, a 10,000-search batch, batches of non-objects, 5,000
   structured documents (a bounded ``X-Prefix-Docs``);
10. **rerank flood**: ``--rerank-documents`` distinct documents in one ``/v1/rerank`` on A (the default limit:
    413); then on R, while a separate probe process sends ``GET /healthz`` to R every 5 ms (each timed from when it
    was due, so a stall counts once per probe it delays), five requests of 10,000 distinct documents (the most the
    default limit accepts) and one of ``--rerank-documents``; the probe's p99 during each phase is compared with
    its p99 in the 3 s before;
11. **slow connections**: replica A's descriptors limited to ``--fd-limit`` (soft and hard, ``prlimit``), then
    ``--slow-connections`` connections each trickling one byte of a request head every 5 s for ``--attack-s``, while
    a probe (``GET /healthz`` and one small chat call) runs every 0.5 s against A. The probe's latency before the
    attack is the baseline of its latency during the attack.
12. **calibration poisoning** (:mod:`loadtest.bench._abuse_poison`, a replica of its own with L2 on): one user's 200
    agreeing look-alike pairs in eight instruction styles ("Reply with just: ACK", the digits one to five, a fixed
    JSON, a system prompt's fixed reply...), then another user's 30 look-alikes needing other answers;
13. **folding** (:mod:`loadtest.bench._abuse_fold`, a replica of its own, exact cache only): pairs whose answers can
    differ asked by two users of a tenant (``fold_wrong_hits``: exact hits among them) and pairs that keep the
    meaning (``fold_kept_hit_share``);
14. **stored objects** (:mod:`loadtest.bench._abuse_stored`): tenant B at tenant A's stored response and chat
    completion, conversations and files, by id and by listing (``stored_object_cross_reads``); then, on a caching
    replica of its own, rounds of a stored response whose exact repeats race its ``DELETE``
    (``deleted_served``: hits of the deleted response after the ``DELETE`` returned);
15. **idempotency bytes**: a keyed flood of large answers against byte budgets (:mod:`.abuse_idempotency`);
16. **rate limits, budgets and key lifetimes** (:mod:`loadtest.bench.abuse_limits`, two replicas of their own on the
    run's Redis): bad admin inputs, a flood from one key, one user's flood through three keys beside another user's
    own allowance, a token flood, a spent budget, an expired key.
17. **Qdrant across tenants** (:mod:`loadtest.bench._abuse_qdrant`): tenant B at tenant A's collection, by A's name
    and by its upstream name — listed, read, scrolled, searched, looked up, aliased, overwritten, deleted — and the
    Qdrant routes kept from tenants (``qdrant_cross_tenant_reads``, ``qdrant_cross_tenant_writes``,
    ``qdrant_kept_routes_open``).
18. **memory**: one key floods each structure it can name or fill, each against a proxy of its own
    (:mod:`.abuse_memory`): ``memory_peak_mb`` (RSS growth per dimension) and ``memory_restart_mb``.

Figures (the last line with ``--json`` is one JSON object): ``requests`` (every request sent that expects an answer,
probes included), ``unbilled_upstream_calls`` (upstream calls clients of the billed replicas caused and the upstream
did, answering 2xx — model runs: LLM ``POST``s of chat, completions, Responses, ``compact``, embeddings, and
reranker ``POST``s; other requests: the rest with an ``X-Request-ID`` — beyond the ledgers' charges of each kind;
the scenarios with replicas of their own, credits off, have upstreams of their own), ``double_charges`` (answers to
one ``Idempotency-Key`` charged under more than one ledger id), ``answers_without_charge`` (2xx answers whose
``X-Credits-Request-ID`` is not in a ledger), ``path_bypass`` (path attacks on the rows answered 2xx or
forwarded upstream), ``free_paths``, ``cross_tenant_deletes``, ``forwarded_override_headers``,
``unparsed_bodies_forwarded``, ``background_unbilled`` (the rows attacked: :mod:`._abuse_rows`),
``calibration_poison_wrong_hits`` (scenario 12),
``unanswered_requests`` (no HTTP answer within 60 s; the deliberate hang-ups are not counted), ``server_errors``
(5xx), ``probe_failures`` (slow-connection and rerank probes), ``cross_tenant_reads`` (scenarios 6 and 14, and the
rows attacked), ``rerank_probe_p99_ratio``
(during the ``--rerank-documents`` rerank; ``..._at_default_limit``: during the 10,000-document ones),
``idempotency_bytes_peak`` (RSS growth under scenario 15; its budget beside it), ``limit_admin_inputs_accepted``,
``rate_limit_overshoot``, ``rate_limit_victim_refusals``, ``rate_limit_answers_without_headers``,
``budget_overshoot`` and ``expired_key_accepted`` (scenario 16), and per
scenario the statuses seen. No timings are asserted; this is a command that prints what happened.

A new data-plane endpoint is not done until this benchmark attacks it (see the README's "Contributing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadtest.bench import (
    _abuse_bodies,
    _abuse_fold,
    _abuse_headers,
    _abuse_paths,
    _abuse_poison,
    _abuse_qdrant,
    _abuse_rows,
    _abuse_stored,
    abuse_idempotency,
    abuse_limits,
    abuse_memory,
)
from loadtest.bench import _surfaces as surfaces
from loadtest.bench._tally import CHAT, EMBEDDINGS, RESPONSES, Tally, chat, send
from loadtest.bench.chaos import Redis
from loadtest.harness import free_port, ledger_charges, proxy_child
from proxy.upstream.settings import Upstreams

USER, TENANT = "abuse-user", "abuse-tenant"
LLM_PATHS = (CHAT, EMBEDDINGS, RESPONSES)
_IDS = re.compile(r"(resp|msg|cmp|fc|rs)_[A-Za-z0-9]+")
MODEL_RUNS = (CHAT, "/v1/completions", EMBEDDINGS, RESPONSES, RESPONSES + "/compact")
"""Upstream paths whose ``POST`` runs a model (what is priced as model work)."""


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
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as client:
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
            key = f"abuse-key-{n}"
            for attempt in range(3):
                await send(client, tally, "idempotent_repeats", "POST", urls[attempt % len(urls)] + CHAT, key=key,
                           json=chat(f"keyed question {n}"))
            await send(client, tally, "idempotent_other_body", "POST", urls[0] + CHAT, key=key,
                       json=chat(f"another keyed question {n}"))


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
def upstreams() -> Iterator[tuple[Any, Any, Any]]:
    """The lenient fake LLM, the Qdrant shim and a fake vLLM reranker on this process's threads, with one small
    collection."""
    from upstream_doubles.lenient_llm import LenientFakeLLM
    from upstream_doubles.qdrant_shim import QdrantShim
    from upstream_doubles.rerankers import FakeReranker

    with LenientFakeLLM(chunk_latency_s=0.01) as llm, QdrantShim() as shim, FakeReranker("vllm") as reranker:
        with httpx.Client(base_url=shim.url, timeout=30) as http:
            http.put("/collections/abuse", json={"vectors": {"size": 4, "distance": "Cosine"}}).raise_for_status()
            http.put("/collections/abuse/points?wait=true", json={"points": [
                {"id": n, "vector": [1.0, float(n), 0.5, 0.25], "payload": {"a": n}} for n in range(20)]})
        yield llm, shim, reranker


def _proxy_env(llm_url: str, data_dir: Path, **settings: str) -> dict[str, str]:
    return {"RAGPROXY_ADMIN__PORT": str(free_port()), "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]),
            "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "true", "RAGPROXY_CACHE__ENABLED": "false",
            "RAGPROXY_SERVER__MAX_BODY_BYTES": str(64 * 1024 * 1024), "RAGPROXY_DATA_DIR": str(data_dir),
            "RAGPROXY_LOGGING__FORMAT": "text", **{f"RAGPROXY_{k.upper()}": v for k, v in settings.items()}}


def _settled(admin: httpx.Client, user: str, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """``user``'s charges once the ledger stopped growing (abandoned streams settle after the client left)."""
    charges, deadline = ledger_charges(admin, user), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        again = ledger_charges(admin, user)
        if len(again) == len(charges):
            return again
        charges = again
    return charges


def _key(admin: httpx.Client, user: str, tenant: str = TENANT) -> dict[str, str]:
    """A new API key of ``user`` with a large balance, as request headers."""
    key = admin.post("/admin/keys", json={"user": user, "tenant": tenant}).json()["key"]
    admin.post(f"/admin/credits/{user}", json={"amount": 1_000_000, "tenant": tenant}).raise_for_status()
    return {"Authorization": f"Bearer {key}"}


def _posts(log: Any, paths: tuple[str, ...]) -> int:
    return sum(1 for entry in log.entries if entry.method == "POST" and entry.path in paths)


def _client_calls(log: Any) -> tuple[int, Counter[str]]:
    """Upstream calls a client caused (they carry the proxy's ``X-Request-ID``; health probes do not) that the
    upstream did (it answered 2xx, or has not answered yet: a stream the client left): the model runs
    (:data:`MODEL_RUNS`), and the rest by method and path (ids masked). An upstream's error costs nothing and is
    charged nothing."""
    caused = [entry for entry in log.entries if "X-Request-ID" in entry.headers
              and (log.status(entry) is None or 200 <= log.status(entry) < 300)]
    runs = sum(1 for entry in caused if entry.method == "POST" and entry.path in MODEL_RUNS)
    others = Counter(f"{entry.method} {_IDS.sub('{id}', entry.path)}" for entry in caused
                     if not (entry.method == "POST" and entry.path in MODEL_RUNS))
    return runs, others


async def rows_attacked(url: str, auth: dict[str, dict[str, str]], llm: Any, tally: Tally,
                        quick: bool) -> dict[str, Any]:
    """The rows attacked (:mod:`._abuse_rows`): paths, headers and bodies, each family against a stored response of
    tenant A's of its own; then whether each of A's responses is still there."""
    rows = _abuse_rows.rows(Upstreams().llm_passthrough)
    seen: dict[str, Any] = {"rows": len(rows)}
    victims = []
    for family, attack in (("paths", _abuse_paths.path_attacks), ("headers", _abuse_headers.header_attacks),
                           ("bodies", _abuse_bodies.body_attacks)):
        victim = await _abuse_rows.stored(url, auth["owner"], f"tenant A's private question for the {family}")
        own = await _abuse_rows.stored(url, auth["other"], f"tenant B's own question for the {family}")
        if victim is None or own is None:
            seen[family] = {"stored_responses_created": False}
            continue
        victims.append(victim)
        arguments = (url, rows, auth, own.response, victim, llm.log, tally)
        seen[family] = await (attack(*arguments, quick) if attack is _abuse_paths.path_attacks
                              else attack(*arguments))
    async with httpx.AsyncClient(headers=auth["owner"], timeout=60.0) as client:
        gone = [(await client.get(f"{url}{RESPONSES}/{victim.response}")).status_code == 404 for victim in victims]
    seen["victims_deleted"] = sum(gone)
    return seen


@dataclass(frozen=True)
class Options:
    quick: bool
    slow: int
    fd_limit: int
    attack_s: float
    rerank_documents: int
    flood: int
    proxy_tree: str | None = None


def run(options: Options) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    if options.proxy_tree is not None:  # every ragproxy serve of the run: that checkout's code, not the cwd's
        os.environ.update(PYTHONPATH=str(Path(options.proxy_tree).resolve()), PYTHONSAFEPATH="1")
    work = Path(tempfile.mkdtemp(prefix="ragproxy-abuse-"))
    quick, tally, timings = options.quick, Tally(), {}
    redis = Redis(work / "redis")
    (work / "redis").mkdir()
    try:
        with ExitStack() as stack:
            redis.start()
            stack.callback(redis.kill)
            llm, shim, reranker = stack.enter_context(upstreams())
            shared = {"REDIS__URL": redis.url, "UPSTREAMS__QDRANT__URL": shim.url,
                      "IDEMPOTENCY__MAX_ENTRIES_PER_USER": "50"}
            envs = [_proxy_env(llm.url, work / f"replica-{n}", **shared) for n in range(2)]
            envs.append(_proxy_env(llm.url, work / "embedded", IDEMPOTENCY__MAX_ENTRIES=str(options.flood // 2)))
            envs.append(_proxy_env(reranker.url, work / "reranker", CACHE__ENABLED="true", CACHE__L2__ENABLED="false",
                                   CACHE__L3__ENABLED="false", LIMITS__RERANK_DOCUMENTS=str(options.rerank_documents)))
            replicas = [stack.enter_context(proxy_child(env)) for env in envs]
            urls = [url for url, _ in replicas]
            admins = [stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{env['RAGPROXY_ADMIN__PORT']}",
                                                       timeout=30)) for env in envs]
            shared_admin, embedded_admin, rerank_admin = admins[0], admins[2], admins[3]
            headers = _key(shared_admin, USER)
            tenants = [_key(shared_admin, f"tenant-{t}-user", f"tenant-{t}") for t in "ab"]
            victim, flooder = _key(embedded_admin, "victim"), _key(embedded_admin, "flooder")
            rerank_headers = _key(rerank_admin, USER)
            broke_key = shared_admin.post("/admin/keys", json={"user": "broke", "tenant": TENANT}).json()["key"]
            broke = {"Authorization": f"Bearer {broke_key}"}  # no credits

            def set_latency(seconds: float) -> None:
                llm.latency_s = seconds

            def restart_redis() -> None:
                redis.kill()
                redis.start()

            async def scenarios() -> dict[str, Any]:
                seen: dict[str, Any] = {}
                started = time.monotonic()
                await same_id_reuse(urls[:2], headers, tally, 60 if quick else 150)
                await abandoned_streams(urls[:2], headers, tally, 10 if quick else 30)
                await idempotent_repeats(urls[:2], headers, tally, 5 if quick else 15)
                seen["hang_ups"] = await surfaces.hang_ups(urls[0], headers, tally, set_latency, 2 if quick else 4)
                timings["billing_s"] = time.monotonic() - started
                started = time.monotonic()
                seen["malformed_bodies"] = await surfaces.malformed(urls[0], headers, tally)
                seen["cross_tenant_responses"] = await surfaces.cross_tenant_responses(urls[0], *tenants, tally)
                seen["rows_attacked"] = await rows_attacked(
                    urls[0], {"broke": broke, "owner": tenants[0], "other": tenants[1]}, llm, tally, quick)
                seen["idempotency_eviction"] = await surfaces.idempotency_under_eviction(
                    urls[2], victim, flooder, tally, set_latency, lambda: _posts(llm.log, LLM_PATHS), options.flood)
                seen["redis_restart"] = await surfaces.redis_restart(urls[:2], str(shared_admin.base_url), headers,
                                                                     tally, restart_redis, 8 if quick else 16)
                timings["surfaces_s"] = time.monotonic() - started
                started = time.monotonic()
                seen["oversize_and_deep"] = await oversize(urls[0], headers, tally, quick)
                seen["rerank_flood"] = await surfaces.rerank_flood(urls[0], urls[3], headers, rerank_headers, tally,
                                                                   options.rerank_documents)
                timings["oversize_s"] = time.monotonic() - started
                seen["calibration_poison"] = await _abuse_poison.calibration_poison(work / "poison", tally)
                seen["fold_variants"] = await _abuse_fold.fold_variants(work / "fold", tally)
                seen["stored_objects"] = await _abuse_stored.cross_reads(urls[0], *tenants, tally)
                seen["qdrant_tenants"] = await _abuse_qdrant.cross_tenant(urls[0], *tenants, "tenant-a", tally)
                seen["deleted"] = await _abuse_stored.deleted_served(work / "deleted", tally, 10 if quick else 40)
                seen["rate_limits"] = await abuse_limits.rate_limits(work / "limits", redis.url, tally)
                _, baseline = await probe(urls[0], headers, time.monotonic() + 5.0, tally)
                resource.prlimit(replicas[0][1].pid, resource.RLIMIT_NOFILE, (options.fd_limit, options.fd_limit))
                attack = asyncio.ensure_future(slow_connections(int(urls[0].rsplit(":", 1)[1]), options.slow,
                                                                options.attack_s))
                await asyncio.sleep(min(5.0, options.attack_s / 4))  # the connections are open
                failures, during = await probe(urls[0], headers, time.monotonic() + options.attack_s - 5.0, tally)
                return {**seen, "slow_connections": await attack, "probe_failures": failures,
                        "probe_baseline": baseline, "probe_attacked": during}

            results = asyncio.run(scenarios())
            charges = [charge for admin, user in [(shared_admin, USER), (shared_admin, "tenant-a-user"),
                                                  (shared_admin, "tenant-b-user"), (shared_admin, "broke"),
                                                  (embedded_admin, "victim"), (embedded_admin, "flooder"),
                                                  (rerank_admin, USER)]
                       for charge in _settled(admin, user)] + results["rate_limits"].pop("charges")
            runs, others = _client_calls(llm.log)
            calls = {"model_runs": runs + _posts(reranker.log, (surfaces.RERANK,)), "other": sum(others.values())}
            results["other_upstream_calls"] = dict(others)
            entries = llm.log.entries
            results["forwarded_override_headers"] = _abuse_rows.forwarded_override_headers(entries)
            results["unparsed_bodies_forwarded"] = _abuse_rows.unparsed_bodies_forwarded(entries)
            results["upstream_reread"] = len(llm.reread)
            results["idempotency_bytes"] = abuse_idempotency.flood(llm.url, redis.url, quick)
            results["memory"] = abuse_memory.run(200 if quick else 600, list(abuse_memory.DIMENSIONS), {})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _figures(tally, results, charges, calls, timings, options)


def _p50_ms(samples: list[float]) -> float | None:
    return round(statistics.median(samples) * 1000, 1) if samples else None


def _figures(tally: Tally, results: dict[str, Any], charges: list[dict[str, Any]], calls: dict[str, int],
             timings: dict[str, float], options: Options) -> dict[str, Any]:
    upstream_charges = [c for c in charges if c["tier"] == "upstream"]
    run_charges = sum(1 for c in upstream_charges if c.get("model") not in ("request", "vector-search"))
    request_charges = sum(1 for c in upstream_charges if c.get("model") == "request")
    charged = {str(c["request_id"]) for c in charges}
    baseline, attacked = _p50_ms(results["probe_baseline"]), _p50_ms(results["probe_attacked"])
    rerank = results["rerank_flood"]
    rows = results["rows_attacked"]
    families = [rows[family] for family in ("paths", "headers", "bodies") if "tried" in rows.get(family, {})]
    return {
        "benchmark": "abuse", "quick": options.quick, "requests": tally.requests,
        "unbilled_upstream_calls": max(0, calls["model_runs"] - run_charges) + max(0, calls["other"] - request_charges),
        "double_charges": tally.double_charges,
        "unanswered_requests": tally.unanswered, "server_errors": tally.server_errors,
        "probe_failures": results["probe_failures"] + rerank["probe_failures"],
        "cross_tenant_reads": tally.cross_tenant_reads + sum(f["cross_tenant_reads"] for f in families),
        "cross_tenant_deletes": sum(f["cross_tenant_deletes"] for f in families),
        "free_paths": sum(f["free_paths"] for f in families),
        "forwarded_override_headers": results["forwarded_override_headers"],
        "unparsed_bodies_forwarded": results["unparsed_bodies_forwarded"],
        "background_unbilled": rows.get("bodies", {}).get("background_unbilled", 0),
        "path_bypass": rows.get("paths", {}).get("bypasses", 0),
        "calibration_poison_wrong_hits": results["calibration_poison"]["wrong_hits"],
        "fold_wrong_hits": results["fold_variants"]["wrong_hits"],
        "fold_kept_hit_share": results["fold_variants"]["kept_hit_share"],
        "stored_object_cross_reads": results["stored_objects"]["cross_reads"],
        "qdrant_cross_tenant_reads": results["qdrant_tenants"]["reads"],
        "qdrant_cross_tenant_writes": results["qdrant_tenants"]["writes"],
        "qdrant_kept_routes_open": results["qdrant_tenants"]["kept_routes_open"],
        "deleted_served": results["deleted"]["served_after_delete"],
        **abuse_limits.figures(results["rate_limits"]),
        "rerank_probe_p99_ratio": rerank["raised_limit"]["probe_p99_ratio"],
        "idempotency_bytes_peak": results["idempotency_bytes"]["idempotency_bytes_peak"],
        "memory_peak_mb": results["memory"]["peak_mb"], "memory_restart_mb": results["memory"]["restart_mb"],
        "rerank_probe_p99_ratio_at_default_limit": rerank["at_limit"]["probe_p99_ratio"],
        "upstream_calls": calls, "ledger_charges": len(charges), "upstream_reread": results["upstream_reread"],
        "other_upstream_calls": results["other_upstream_calls"],
        "answers_without_charge": len(set(tally.ledger_ids) - charged),
        "probe_p50_ms_baseline": baseline, "probe_p50_ms_under_attack": attacked,
        "probe_p50_ratio_to_baseline": round(attacked / baseline, 2) if baseline and attacked else None,
        "charges_by_usage_source": dict(Counter(str(c.get("usage_source")) for c in charges)),
        "statuses": {name: dict(counts) for name, counts in tally.statuses.items()},
        **{name: results[name] for name in ("hang_ups", "malformed_bodies", "cross_tenant_responses", "rows_attacked",
                                            "idempotency_eviction", "redis_restart", "rerank_flood",
                                            "oversize_and_deep", "idempotency_bytes", "calibration_poison",
                                            "fold_variants", "stored_objects", "deleted", "rate_limits",
                                            "qdrant_tenants")},
        "slow_connections": {"connections": options.slow, "fd_limit": options.fd_limit,
                             "attack_s": options.attack_s, "ended": results["slow_connections"]},
        "seconds": {name: round(value, 1) for name, value in timings.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench abuse", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, 20,000 items at most (about 3 min)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--slow-connections", type=int, default=None, help="slow connections (300 quick, 600)")
    parser.add_argument("--fd-limit", type=int, default=None, help="replica A's descriptors (256 quick, 512)")
    parser.add_argument("--attack-s", type=float, default=None, help="seconds of slow connections (20 quick, 40)")
    parser.add_argument("--rerank-documents", type=int, default=100_000, help="documents of the rerank flood")
    parser.add_argument("--flood", type=int, default=None, help="idempotency keys the flooder sends (120 quick, "
                        "300); the embedded replica holds half as many")
    parser.add_argument("--proxy-tree", default=None, help="run ragproxy serve from this checkout (e.g. main's) "
                        "against this tree's attacks")
    args = parser.parse_args(argv)
    options = Options(args.quick, args.slow_connections or (300 if args.quick else 600),
                      args.fd_limit or (256 if args.quick else 512), args.attack_s or (20.0 if args.quick else 40.0),
                      args.rerank_documents, args.flood or (120 if args.quick else 300), args.proxy_tree)
    result = run(options)
    for name, value in result.items():
        print(f"{name:>30}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    if args.json:
        print(json.dumps(result))
    return 0
