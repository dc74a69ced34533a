"""``python -m loadtest.bench kv [--quick] [--json]``: KV reuse on real llama-server replicas, direct vs proxy.

Needs ``llama-server`` and a model: runs ``scripts/build_llama_server.sh`` (idempotent; the first build takes
minutes) and ``scripts/make_tiny_gguf.py`` when they are missing (override with ``RAGPROXY_LLAMA_SERVER`` /
``RAGPROXY_TINY_GGUF``). Not part of the default test run.

Workload: a corpus of documents with Zipf-distributed popularity; each request has one system prompt, the
top-k (3-5) documents in a varying retrieval order, and a fresh question. Both sides send the same requests,
one at a time, each first direct then through the proxy (interleaved, so both see the same load on this shared
machine), to two separate sets of 2 fresh llama-server replicas (each with ``--slots`` slots):

* direct — what an app does without ragproxy: documents rendered in retrieval order (the same byte-stable
  template as the proxy's, so only order, routing and hints differ), replicas taken in round-robin, server defaults;
* proxy — the request carries its documents as ``ragproxy.documents`` and goes through the proxy's ``Shape``
  (``reuse`` order, or ``shift`` with ``--order shift``) and ``Route`` stages (knowledge tree per replica, TTFT
  router, llama.cpp ``cache_prompt`` hint — these servers keep prompts in host memory, so the slot is theirs to
  pick, see :class:`~proxy.kv.hints.SlotTable` — tree correction from ``timings.cache_n``, slots and capacity
  read from ``/slots``), run in-process as a pipeline whose terminal sends the shaped body to the chosen replica
  (the HTTP front is not involved).

Two phases, both sent to both sides: ``--warmup`` requests (default: as many as are measured), then the measured
requests. The headline ``ttft_speedup`` is the measured phase — steady state, what an app that keeps the proxy in
front of its servers sees; ``ttft_speedup_cold`` is the warm-up phase itself, from fresh servers (every cache
empty), reported beside it. Why a warm-up as long as the measurement: the first requests after a start fill the
caches (of both sides) and say little about a service that runs for days; with a 10-document corpus, reuse keeps
rising with longer warm-ups (more document combinations repeat), so an equal split is a conservative choice,
not a tuned one.

Parameters and why: documents of ``--doc-words`` 200 words (~430 tokens of this tokenizer; RAG chunks are
typically 200-500 tokens), top-k 3-5 (the usual range), a ~180-token system prompt, so prompts are ~1,500-2,400
tokens; 10 documents with Zipf(1.1) popularity in quick mode (24 in the full run). Before the phases the
per-request fixed cost of a replica is measured — the TTFT of a one-token prompt (``fixed_cost_ms``): what no
prefix reuse can remove.

TTFT is the wall time of a one-token completion (prefill + one decode step). ``prefix_token_reuse`` is, from
the server's own ``timings``, ``sum(cache_n) / sum(cache_n + prompt_n)`` over the proxy side (``..._direct``
too), per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from normalizer.documents import Document, render, render_document
from proxy.context import Reply, RequestContext
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.pipeline import Pipeline
from proxy.server.request import Request
from proxy.stages.prompt import ReadPrompt
from proxy.upstream.client import UpstreamClient

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RAGPROXY_LLAMA_CACHE", Path.home() / ".cache" / "ragproxy"))

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "gu", "he", "zo", "fi", "ba", "ly"]


@dataclass(frozen=True, slots=True)
class Workload:
    system: str
    documents: list[Document]
    requests: list[tuple[list[int], str]]
    """Per request: indices of its documents in retrieval order, and its question."""


def make_workload(*, docs: int, requests: int, doc_words: int, seed: int, zipf_s: float = 1.1) -> Workload:
    rnd = random.Random(seed)
    words = ["".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 3))) for _ in range(600)]

    def sentence(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n)).capitalize() + "."

    system = "You answer questions using only the documents below. Cite them. " + " ".join(
        sentence(12) for _ in range(6)
    )
    corpus = [
        Document(
            f"doc-{i}", " ".join(sentence(rnd.randint(8, 16)) for _ in range(doc_words // 12)), f"Doc {i}"
        )
        for i in range(docs)
    ]
    weights = [1 / (r + 1) ** zipf_s for r in range(docs)]
    reqs = []
    for i in range(requests):
        k = rnd.randint(3, 5)
        chosen: list[int] = []
        while len(chosen) < k:
            pick = rnd.choices(range(docs), weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        rnd.shuffle(chosen)
        reqs.append((chosen, f"Question {i}: " + sentence(10)))
    return Workload(system, corpus, reqs)


def prefix_reuse_ceiling(work: Workload, first: int = 0, chars_per_token: float = 4.0) -> float:
    """Token reuse of a perfect prefix cache on ``work``, over its requests from index ``first`` on.

    The cache holds every prompt sent before, without limit; each request takes, among the orders the ``reuse``
    policy allows (top-ranked document first or last, the others in any order), the one whose longest cached
    prefix is longest. Prompt = system prompt, documents, question; the question is never reused. Sizes are
    estimated tokens (UTF-8 bytes / ``chars_per_token``), so the figure is comparable with, not equal to, the
    server-reported ``prefix_token_reuse``.
    """

    def size(text: str) -> int:
        return max(1, math.ceil(len(text.encode("utf-8")) / chars_per_token))

    system = size(work.system)
    doc_tokens = [size(render_document(d)) for d in work.documents]
    seen: set[tuple[int, ...]] = set()
    cached = total = 0
    for index, (chosen, question) in enumerate(work.requests):
        top, rest = chosen[0], chosen[1:]
        orders = [(top, *p) for p in itertools.permutations(rest)] + [(*p, top) for p in itertools.permutations(rest)]
        best_order, best = orders[0], -1
        for order in orders:
            reused = system if index else 0  # the system prompt is cached from the second request on
            for depth in range(1, len(order) + 1):
                if order[:depth] not in seen:
                    break
                reused += doc_tokens[order[depth - 1]]
            if reused > best:
                best_order, best = order, reused
        seen.update(best_order[:depth] for depth in range(1, len(best_order) + 1))
        if index >= first:
            cached += best
            total += system + sum(doc_tokens[d] for d in chosen) + size(question)
    return cached / total if total else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_binaries() -> tuple[Path, Path]:
    server = Path(os.environ.get("RAGPROXY_LLAMA_SERVER", CACHE / "llama-server"))
    if not server.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], check=True)
    model = Path(os.environ.get("RAGPROXY_TINY_GGUF", CACHE / "tiny-llama.gguf"))
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_tiny_gguf.py"), "--out", str(model)], check=True
        )
    return server, model


class Servers:
    """Fresh llama-server replicas for one phase (started and stopped by this process only)."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        count: int,
        slots: int,
        ctx_per_slot: int,
        threads: int,
        cache_ram_mib: int = 2048,
    ) -> None:
        self.urls: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs = tempfile.TemporaryDirectory(prefix="ragproxy-llama-")
        for i in range(count):
            port = _free_port()
            log = open(Path(self._logs.name) / f"server-{i}.log", "wb")  # noqa: SIM115
            command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
            command += ["-c", str(ctx_per_slot * slots), "-np", str(slots), "-t", str(threads)]
            command += ["-tb", str(threads), "--poll", "0", "--no-warmup", "-b", "512", "-ub", "512"]
            command += ["--cache-ram", str(cache_ram_mib)]
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self._procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        for url, proc in zip(self.urls, self._procs, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited with {proc.returncode}; logs in {self._logs.name}"
                    )
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"llama-server at {url} not ready")
                time.sleep(0.2)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._logs.cleanup()


@dataclass(slots=True)
class Sample:
    ttft_s: float
    cache_n: int
    prompt_n: int


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0}


async def fixed_cost_ms(url: str, repeats: int = 5) -> float:
    """Median TTFT of a one-token prompt on an idle replica: the per-request cost no reuse removes."""
    times = []
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            response = await client.post(
                url + "/completion", json={"prompt": "a", "n_predict": 1, "cache_prompt": False}
            )
            times.append(time.perf_counter() - started)
            response.raise_for_status()
    return statistics.median(times) * 1000


async def direct_samples(urls: list[str], work: Workload, shift: int = 0) -> AsyncGenerator[Sample, None]:
    """One sample per request, sent the way an app does without the proxy (with ``n_cache_reuse: shift`` when
    ``shift`` > 0: what that llama.cpp option does without the proxy's order and routing)."""
    async with httpx.AsyncClient(timeout=120) as client:
        for i, (indices, question) in enumerate(work.requests):
            docs = [work.documents[j] for j in indices]
            body = _body(render(work.system, docs, question))
            if shift:
                body["n_cache_reuse"] = shift
            started = time.perf_counter()
            response = await client.post(urls[i % len(urls)] + "/v1/chat/completions", json=body)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            timings = response.json().get("timings", {})
            yield Sample(elapsed, int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0)))


async def proxy_samples(
    urls: list[str], work: Workload, slots: int, ctx_per_slot: int, policy: OrderPolicy = OrderPolicy.REUSE
) -> AsyncGenerator[Sample, None]:
    """One sample per request, sent through the Shape and Route stages."""
    models = [PrefillModel(PrefillCoefficients(0.02, 0.0006, 0.0), min_observations=4) for _ in urls]
    replicas = [
        Replica(
            index=i,
            kind=LLAMACPP,
            tree=KnowledgeTree(slots * ctx_per_slot * 8, prefill=models[i]),
            prefill=models[i],
            queue=AdmissionQueue(limit=slots),
            slots=SlotTable(slots),
        )
        for i in range(len(urls))
    ]
    router = Router(models, ttft_slo_s=None)
    client = UpstreamClient(connect_timeout=5, read_timeout=10, pool_size=1)
    try:  # the real slot count and KV size, as the proxy reads them
        for replica, url in zip(replicas, urls, strict=True):
            answer = await read_slots(client, url, {})
            if answer is not None:
                apply_slots(answer, tree=replica.tree, load=router.loads[replica.index], slot_table=replica.slots)
    finally:
        await client.close()
    async with httpx.AsyncClient(timeout=120) as client:

        async def send(ctx: RequestContext) -> Reply:
            routed = ctx.routed
            assert routed is not None
            response = await client.post(
                urls[routed.replica] + "/v1/chat/completions",
                content=ctx.outgoing_body(),
                headers={"Content-Type": "application/json", **(routed.headers or {})},
            )
            return Reply(response.status_code, body=response.content)

        pipeline = Pipeline([ReadPrompt(None), Shape(replicas, default_policy=policy), Route(replicas, router)], send)
        for i, (indices, question) in enumerate(work.requests):
            body = _body([{"role": "system", "content": work.system}, {"role": "user", "content": question}])
            documents = {
                "documents": [
                    {
                        "id": work.documents[j].id,
                        "text": work.documents[j].text,
                        "title": work.documents[j].title,
                    }
                    for j in indices
                ]
            }
            ctx = RequestContext(
                request=Request("POST", "/v1/chat/completions"),
                route="chat",
                request_id=f"kv-{i}",
                raw_body=orjson.dumps(body),
                body=body,
                proxy_fields={"ragproxy": documents},
            )
            started = time.perf_counter()
            reply = await pipeline(ctx)
            elapsed = time.perf_counter() - started
            if reply.status != 200:
                raise RuntimeError(f"backend answered {reply.status}: {reply.body!r}")
            timings = orjson.loads(reply.body or b"{}").get("timings", {})
            yield Sample(elapsed, int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0)))


async def run_interleaved(
    direct_urls: list[str], proxy_urls: list[str], work: Workload, slots: int, ctx_per_slot: int,
    policy: OrderPolicy = OrderPolicy.REUSE, direct_shift: int = 0,
) -> tuple[list[Sample], list[Sample]]:
    """Each request goes direct, then through the proxy: both see the same (noisy, shared) machine."""
    direct: list[Sample] = []
    proxied: list[Sample] = []
    direct_iter = direct_samples(direct_urls, work, direct_shift)
    proxy_iter = proxy_samples(proxy_urls, work, slots, ctx_per_slot, policy)
    for _ in work.requests:
        direct.append(await anext(direct_iter))
        proxied.append(await anext(proxy_iter))
    await direct_iter.aclose()
    await proxy_iter.aclose()
    return direct, proxied


def _reuse(samples: list[Sample]) -> float:
    cached = sum(s.cache_n for s in samples)
    total = cached + sum(s.prompt_n for s in samples)
    return cached / total if total else 0.0


@dataclass(slots=True)
class Phase:
    direct: list[Sample]
    proxy: list[Sample]

    def summary(self) -> dict[str, float]:
        p50_direct = statistics.median(s.ttft_s for s in self.direct) * 1000
        p50_proxy = statistics.median(s.ttft_s for s in self.proxy) * 1000
        return {
            "ttft_p50_direct_ms": round(p50_direct, 1),
            "ttft_p50_proxy_ms": round(p50_proxy, 1),
            "ttft_mean_direct_ms": round(statistics.mean(s.ttft_s for s in self.direct) * 1000, 1),
            "ttft_mean_proxy_ms": round(statistics.mean(s.ttft_s for s in self.proxy) * 1000, 1),
            "ttft_speedup": round(p50_direct / p50_proxy, 2),
            "prefix_token_reuse": round(_reuse(self.proxy), 3),
            "prefix_token_reuse_direct": round(_reuse(self.direct), 3),
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench kv")
    parser.add_argument("--quick", action="store_true", help="fewer requests and documents")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--requests", type=int, help="measured requests (quick 16, else 40)")
    parser.add_argument("--warmup", type=int, help="requests sent before, not counted (default: --requests)")
    parser.add_argument("--docs", type=int)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads per replica")
    parser.add_argument("--doc-words", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--order", choices=["reuse", "shift"], default="reuse",
                        help="the proxy's order policy (shift: approximate reuse outside the prefix, see "
                             "proxy.kv.order)")
    parser.add_argument("--direct-shift", type=int, default=0, metavar="N",
                        help="the direct side sends n_cache_reuse=N too (a baseline for --order shift)")
    parser.add_argument("--verbose", action="store_true", help="print every request's TTFT and timings")
    args = parser.parse_args(argv)
    requests = args.requests or (16 if args.quick else 40)
    warmup = requests if args.warmup is None else args.warmup
    docs = args.docs or (10 if args.quick else 24)
    ctx_per_slot = 8192
    server, model = ensure_binaries()
    work = make_workload(docs=docs, requests=warmup + requests, doc_words=args.doc_words, seed=args.seed)
    started = time.perf_counter()
    direct_servers = Servers(server, model, args.replicas, args.slots, ctx_per_slot, args.threads)
    proxy_servers = Servers(server, model, args.replicas, args.slots, ctx_per_slot, args.threads)
    try:
        direct_servers.wait_ready()
        proxy_servers.wait_ready()
        fixed_ms = asyncio.run(fixed_cost_ms(proxy_servers.urls[-1]))
        direct, proxied = asyncio.run(
            run_interleaved(direct_servers.urls, proxy_servers.urls, work, args.slots, ctx_per_slot,
                            OrderPolicy(args.order), args.direct_shift)
        )
    finally:
        direct_servers.stop()
        proxy_servers.stop()
    if args.verbose:
        for i, (d, p) in enumerate(zip(direct, proxied, strict=True)):
            mark = "w" if i < warmup else " "
            print(
                f" {mark}#{i:<3} direct {d.ttft_s * 1000:7.0f} ms cached {d.cache_n:5} computed {d.prompt_n:5}"
                f" | proxy {p.ttft_s * 1000:7.0f} ms cached {p.cache_n:5} computed {p.prompt_n:5}"
            )
    cold = Phase(direct[:warmup], proxied[:warmup]) if warmup else None
    steady = Phase(direct[warmup:], proxied[warmup:])
    prompt_tokens = statistics.mean(s.cache_n + s.prompt_n for s in direct)
    summary: dict[str, object] = {
        "bench": "kv",
        "requests": requests,
        "warmup_requests": warmup,
        "documents": docs,
        "replicas": args.replicas,
        "slots_per_replica": args.slots,
        "order": args.order,
        "direct_n_cache_reuse": args.direct_shift,
        "mean_prompt_tokens": round(prompt_tokens),
        "fixed_cost_ms": round(fixed_ms, 1),
        **steady.summary(),
        "prefix_token_reuse_ceiling": round(prefix_reuse_ceiling(work, warmup), 3),
    }
    if cold is not None:
        summary.update({f"{k}_cold" if k.startswith(("ttft_sp", "prefix")) else f"cold_{k}": v
                        for k, v in cold.summary().items()})
    summary["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(
        f"{warmup} warm-up + {requests} measured requests, {docs} documents, {args.replicas} llama-server "
        f"replicas x {args.slots} slots, ~{summary['mean_prompt_tokens']} prompt tokens, "
        f"fixed cost {summary['fixed_cost_ms']} ms"
    )
    for name, phase in (("cold start (warm-up)", cold), ("steady state (measured)", steady)):
        if phase is None:
            continue
        figures = phase.summary()
        print(f"  {name}:")
        print(
            f"    direct: TTFT p50 {figures['ttft_p50_direct_ms']:8.1f} ms   prefix reuse "
            f"{figures['prefix_token_reuse_direct']:.3f}"
        )
        print(
            f"    proxy:  TTFT p50 {figures['ttft_p50_proxy_ms']:8.1f} ms   prefix reuse "
            f"{figures['prefix_token_reuse']:.3f}"
        )
        print(f"    ttft_speedup (p50 direct / p50 proxy): {figures['ttft_speedup']}")
    print(f"  a perfect prefix cache with the same order rule would reuse {summary['prefix_token_reuse_ceiling']}"
          " of the measured requests' prompt tokens (estimated tokens)")
    if args.json:
        print(json.dumps(summary))
    return 0
