"""Memory abuse: one key floods each structure it can name or fill; the proxy's RSS growth per dimension.

Part of ``python -m loadtest.bench abuse``; alone: ``python -m loadtest.bench abuse_memory [--quick] [--json]
[--count N] [--dimensions a,b,...] [--env KEY=VALUE ...]``.

Each dimension runs against a ``ragproxy serve`` of its own (embedded, API keys, credits off, every cache tier on
with its defaults: the local embedder, the hnsw index under ``data_dir``) in front of a fake LLM and the TEST-ONLY
Qdrant shim (``upstream_doubles``, in this process). One key sends ``--count`` requests, 8 at a time, each naming or
filling something new:

* ``namespaces``: one question in each of ``count`` namespaces (``X-Ragproxy-Namespace``);
* ``system_prompts``: one question under each of ``count`` system prompts;
* ``context_variants``: one question after each of ``count`` earlier turns (a context signature apiece);
* ``namespaces_and_system_prompts``: ``count`` of each (the issue's headline check);
* ``templates``: multi-line questions of 32 distinct lines, 16 per namespace (a question template's whole window);
* ``evidence``: questions carrying 64 documents with 64-character ids, answered citing every one, in one namespace;
* ``collections``: searches with distinct vectors and 100 results each over 8 collections of the shim.

The process's RSS is read (``/proc``) once it has settled after a warm-up (the embedding model loaded), every 50 ms
during the flood (``peak_bytes``: the highest minus that baseline), and once the flood is over and settled; then
the process is stopped (it saves its index) and started again on the same ``data_dir``, warmed up the same way
(``restart_bytes``: its settled RSS minus the first baseline). ``ledger`` is the ``memory`` section of
``/admin/stats`` after the flood (each structure's bytes and budget), when the proxy has one.

Goals (issue 48): ``namespaces_and_system_prompts`` at ``count`` 600: growth at most 128 MB, after a restart too;
``namespaces`` at ``count`` 10,000: within the configured total (``ledger``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness import free_port, new_key, proxy_child

CHAT = "/v1/chat/completions"
TENANT, USER = "memory-tenant", "memory-flooder"
CONCURRENCY = 8
DOCUMENTS, ID_CHARS = 64, 64
CITE_ALL = "Cite every document."
COLLECTIONS, POINTS, DIM, LIMIT = 8, 200, 32, 100
DIMENSIONS = ("namespaces", "system_prompts", "context_variants", "namespaces_and_system_prompts", "templates",
              "evidence", "collections")


@dataclass(frozen=True, slots=True)
class Call:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 16, "messages": messages, **extra}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _namespace(n: int) -> Call:
    return Call(CHAT, _chat([_user(f"What does setting number {n} change?")]), {"X-Ragproxy-Namespace": f"ns-{n}"})


def _system_prompt(n: int) -> Call:
    return Call(CHAT, _chat([{"role": "system", "content": f"You are assistant number {n}. Answer briefly."},
                             _user(f"Which option controls feature {n}?")]), {})


def _context_variant(n: int) -> Call:
    return Call(CHAT, _chat([_user(f"Earlier question {n}?"), {"role": "assistant", "content": f"Earlier reply {n}."},
                             _user(f"And what about part {n}?")]), {})


def _template(n: int) -> Call:
    lines = [f"line {i} of text {n}: {'word ' * 8}{n * 31 + i}" for i in range(32)]
    return Call(CHAT, _chat([_user("\n".join(lines))]), {"X-Ragproxy-Namespace": f"tpl-{n // 16}"})


def _evidence(n: int) -> Call:
    documents = [{"id": f"{n:08d}-{i:04d}-".ljust(ID_CHARS, "x"), "text": f"Passage {i} of question {n}: the value "
                  f"is {n * 64 + i}.", "title": f"Document title {n}-{i}"} for i in range(DOCUMENTS)]
    return Call(CHAT, {**_chat([_user(f"What do the passages say about item {n}? {CITE_ALL}")]),
                       "ragproxy": {"documents": documents}}, {"X-Ragproxy-Namespace": "evidence"})


def _search(n: int) -> Call:
    vector = [((n * 7919 + i * 104729) % 1000) / 1000.0 + 0.001 for i in range(DIM)]
    return Call(f"/collections/mem-{n % COLLECTIONS}/points/search",
                {"vector": vector, "limit": LIMIT, "with_payload": True}, {})


def calls(dimension: str, count: int) -> list[Call]:
    """The requests one dimension's flood sends."""
    if dimension == "namespaces_and_system_prompts":
        return [call for n in range(count) for call in (_namespace(n), _system_prompt(n))]
    build: dict[str, Callable[[int], Call]] = {
        "namespaces": _namespace, "system_prompts": _system_prompt, "context_variants": _context_variant,
        "templates": _template, "evidence": _evidence, "collections": _search}
    return [build[dimension](n) for n in range(count)]


def answer(prompt: str) -> str:
    """The fake LLM's answer: every document cited where the prompt asks so, else a short per-prompt text."""
    if CITE_ALL in prompt:
        return "As the sources say " + " ".join(f"[{i}]" for i in range(1, DOCUMENTS + 1))
    return f"Answer to: {' '.join(prompt.split()[-6:])}"


def rss(pid: int) -> int:
    """Resident bytes of a process (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def settled_rss(pid: int, timeout_s: float = 20.0) -> int:
    """RSS once it stops moving (three reads 0.5 s apart within 1 MB), or after ``timeout_s``."""
    seen = [rss(pid)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        seen.append(rss(pid))
        if len(seen) >= 3 and max(seen[-3:]) - min(seen[-3:]) < 1024 * 1024:
            break
    return seen[-1]


async def _flood(url: str, headers: dict[str, str], batch: list[Call], statuses: dict[str, int]) -> None:
    queue = list(reversed(batch))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        async def worker() -> None:
            while queue:
                call = queue.pop()
                try:
                    reply = await client.post(call.path, json=call.body, headers=call.headers)
                    status = str(reply.status_code)
                except httpx.HTTPError:
                    status = "no answer"
                statuses[status] = statuses.get(status, 0) + 1

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def _peak(pid: int, work: Any) -> int:
    task = asyncio.ensure_future(work)
    peak = rss(pid)
    while not task.done():
        peak = max(peak, rss(pid))
        await asyncio.sleep(0.05)
    await task
    return max(peak, rss(pid))


def _warm(url: str, headers: dict[str, str], admin: httpx.Client, tag: str) -> None:
    """Requests until the semantic tier has looked one up (its embedding model is loaded), and a search."""
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        deadline = time.monotonic() + 120
        n = 0
        while time.monotonic() < deadline:
            n += 1
            client.post(CHAT, json=_chat([_user(f"warm-up question {tag} {n}?")]),
                        headers={"X-Ragproxy-Namespace": "warm-up"})
            l2 = admin.get("/admin/stats").json().get("tiers", {}).get("l2", {})
            if n >= 3 and l2.get("lookups", 0) - l2.get("errors", 0) >= 2:
                break
            time.sleep(0.5)
        client.post(_search(0).path, json=_search(0).body)


def _env(llm_url: str, qdrant_url: str, data_dir: Path, admin_port: int, extra: dict[str, str]) -> dict[str, str]:
    return {"RAGPROXY_ADMIN__PORT": str(admin_port), "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]),
            "RAGPROXY_UPSTREAMS__QDRANT__URL": qdrant_url, "RAGPROXY_AUTH__MODE": "keys",
            "RAGPROXY_CREDITS__ENABLED": "false", "RAGPROXY_CACHE__ENABLED": "true",
            "RAGPROXY_DATA_DIR": str(data_dir), "RAGPROXY_LOGGING__FORMAT": "text",
            "RAGPROXY_SERVER__MAX_BODY_BYTES": str(16 * 1024 * 1024), **extra}


@contextmanager
def _replica(env: dict[str, str]) -> Iterator[tuple[str, int, httpx.Client]]:
    with proxy_child(env) as (url, process), \
            httpx.Client(base_url=f"http://127.0.0.1:{env['RAGPROXY_ADMIN__PORT']}", timeout=60) as admin:
        for _ in range(200):
            try:
                admin.get("/admin/stats")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, process.pid, admin


def dimension(name: str, count: int, llm_url: str, qdrant_url: str, work: Path,
              extra: dict[str, str]) -> dict[str, Any]:
    """Flood one dimension, then restart: the figures named in the module docstring."""
    env = _env(llm_url, qdrant_url, work / name, free_port(), extra)
    statuses: dict[str, int] = {}
    batch = calls(name, count)
    with _replica(env) as (url, pid, admin):
        headers = new_key(admin, USER, TENANT)
        _warm(url, headers, admin, "first")
        baseline = settled_rss(pid)
        started = time.monotonic()
        peak = asyncio.run(_peak(pid, _flood(url, headers, batch, statuses)))
        seconds = time.monotonic() - started
        after = settled_rss(pid)
        ledger = admin.get("/admin/stats").json().get("memory")
    with _replica(env) as (url, pid, admin):
        _warm(url, headers, admin, "again")
        restarted = settled_rss(pid)
        ledger_after_restart = admin.get("/admin/stats").json().get("memory")
    mb = 1024 * 1024
    return {"requests": len(batch), "seconds": round(seconds, 1), "baseline_mb": round(baseline / mb, 1),
            "peak_mb": round((peak - baseline) / mb, 1), "after_mb": round((after - baseline) / mb, 1),
            "restart_mb": round((restarted - baseline) / mb, 1), "statuses": statuses, "ledger": ledger,
            "ledger_after_restart": ledger_after_restart}


@contextmanager
def upstreams() -> Iterator[tuple[str, str]]:
    """The fake LLM (citing where asked) and the Qdrant shim with :data:`COLLECTIONS` collections."""
    from upstream_doubles.llm_server import FakeLLM
    from upstream_doubles.qdrant_shim import QdrantShim

    with FakeLLM(answer=answer) as llm, QdrantShim() as shim:
        with httpx.Client(base_url=shim.url, timeout=60) as http:
            for c in range(COLLECTIONS):
                http.put(f"/collections/mem-{c}", json={"vectors": {"size": DIM, "distance": "Cosine"}}
                         ).raise_for_status()
                http.put(f"/collections/mem-{c}/points?wait=true", json={"points": [
                    {"id": n, "vector": [((n * 31 + i * 17) % 97) / 97.0 + 0.01 for i in range(DIM)],
                     "payload": {"title": f"point {n} of collection {c}", "text": "some payload text " * 4}}
                    for n in range(POINTS)]}).raise_for_status()
        yield llm.url, shim.url


def run(count: int, dimensions: list[str], extra: dict[str, str]) -> dict[str, Any]:
    """Every dimension named, each against a proxy of its own."""
    work = Path(tempfile.mkdtemp(prefix="ragproxy-abuse-memory-"))
    try:
        with ExitStack() as stack:
            llm_url, qdrant_url = stack.enter_context(upstreams())
            results = {name: dimension(name, count, llm_url, qdrant_url, work, extra) for name in dimensions}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"benchmark": "abuse_memory", "count": count,
            "peak_mb": {name: result["peak_mb"] for name, result in results.items()},
            "restart_mb": {name: result["restart_mb"] for name, result in results.items()},
            "dimensions": results}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench abuse_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 requests per dimension instead of 600")
    parser.add_argument("--count", type=int, default=None, help="requests per dimension (600; 200 with --quick)")
    parser.add_argument("--dimensions", default=",".join(DIMENSIONS), help="comma-separated, of: "
                        + ", ".join(DIMENSIONS))
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the proxies (RAGPROXY_...)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    names = [name for name in args.dimensions.split(",") if name]
    unknown = sorted(set(names) - set(DIMENSIONS))
    if unknown:
        parser.error(f"unknown dimensions {unknown}; known: {', '.join(DIMENSIONS)}")
    extra = dict(item.split("=", 1) for item in args.env)
    count = args.count if args.count is not None else 200 if args.quick else 600
    result = run(count, names, extra)
    for name, figures in result["dimensions"].items():
        print(f"{name:>32}: peak +{figures['peak_mb']} MB, after +{figures['after_mb']} MB, restart "
              f"+{figures['restart_mb']} MB ({figures['requests']} requests in {figures['seconds']} s, "
              f"{figures['statuses']})")
    if args.json:
        print(json.dumps(result))
    return 0
