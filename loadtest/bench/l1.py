"""``python -m loadtest.bench l1 [--quick] [--json]``: exact-tier hits through HTTP vs a bare handler.

In one run, against the same client: a ``ragproxy serve`` process whose L1 holds the answers (primed first), and a
bare aiohttp process that returns the same bytes for the same requests with no work at all. Reported: hit latency
p50/p99 at concurrency 1, and requests per second at concurrency 32 for both, with their ratio.

Also, in this process: ``gc_full_ms``, the pause of one full collection of the cyclic garbage collector with an L1
store of the default bounds full (``l1.max_entries`` chat answers, five tags each, as the proxy stores them), after
``gc.freeze()`` as the proxy does after start-up. Every tenant's requests wait for such a pause.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time

import aiohttp
import orjson
from aiohttp import web

from loadtest.harness import child, closed_loop, free_port, percentiles, proxy_process

QUESTIONS = 64


def _body(i: int) -> bytes:
    return orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": f"cached question {i}"}]})


def bare_app(answer: bytes) -> web.Application:
    """The baseline: an aiohttp handler that reads the request and returns fixed bytes."""

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def measure_hits(proxy: str, bare: str, quick: bool, expect_tier: str) -> dict[str, float]:
    """Prime the proxy, then measure hits against ``bare`` in the same run."""
    results: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(QUESTIONS):
            async with session.post(proxy + "/v1/chat/completions", data=_body(i),
                                    headers={"Content-Type": "application/json"}) as response:
                await response.read()
        await asyncio.sleep(0.5)  # stores finish just after the answer is sent
        counter = {"n": 0, "wrong": 0}

        def caller(base: str) -> object:
            async def call() -> None:
                counter["n"] += 1
                async with session.post(base + "/v1/chat/completions", data=_body(counter["n"] % QUESTIONS),
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    if base == proxy and response.headers.get("X-Cache-Tier") != expect_tier:
                        counter["wrong"] += 1
            return call

        for base in (proxy, bare):
            await closed_loop(caller(base), 4, 300)  # type: ignore[arg-type]
        rounds, per_round = (3, 200) if quick else (5, 600)
        latencies: dict[str, list[float]] = {"proxy": [], "bare": []}
        for _ in range(rounds):
            for name, base in (("proxy", proxy), ("bare", bare)):
                _, samples = await closed_loop(caller(base), 1, per_round)  # type: ignore[arg-type]
                latencies[name].extend(samples)
        hit, base_lat = percentiles(latencies["proxy"]), percentiles(latencies["bare"])
        results.update({"hit_p50_ms": hit["p50_ms"], "hit_p99_ms": hit["p99_ms"],
                        "bare_p50_ms": base_lat["p50_ms"], "bare_p99_ms": base_lat["p99_ms"]})
        total = 2000 if quick else 8000
        rps = {}
        for name, base in (("hit", proxy), ("bare", bare)):
            rps[name], _ = await closed_loop(caller(base), 32, total)  # type: ignore[arg-type]
        results.update({"hit_rps": rps["hit"], "bare_rps": rps["bare"], "rps_ratio": rps["hit"] / rps["bare"],
                        "not_from_tier": counter["wrong"]})
    return results


def run(env: dict[str, str], quick: bool, expect_tier: str) -> dict[str, float]:
    """Start the trivial upstream, the proxy (``env``) and the bare baseline; measure."""
    upstream_port, bare_port = free_port(), free_port()
    with child(["-m", "loadtest.trivial_upstream", "--port", str(upstream_port)], upstream_port), \
            child(["-m", "loadtest.bench.l1", "--serve-bare", str(bare_port)], bare_port):
        full_env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": f"http://127.0.0.1:{upstream_port}"}]),
                    "RAGPROXY_ADMIN__ENABLED": "false", "RAGPROXY_ROUTING__ENABLED": "false", **env}
        with proxy_process(full_env) as proxied:
            return asyncio.run(measure_hits(proxied, f"http://127.0.0.1:{bare_port}", quick, expect_tier))


def full_collection_ms(rounds: int = 3) -> float:
    """The median pause of a full collection with a default L1 store full (see the module docstring)."""
    from proxy.answers.settings import L1Settings
    from tiers.memory import MemoryStore
    from tiers.policies import make_policy

    gc.collect()
    gc.freeze()
    l1 = L1Settings()
    store = MemoryStore(make_policy(l1.policy, l1.max_bytes), max_entries=l1.max_entries)
    tags = ("all", "tenant:bench", "ns:bench/default", "route:chat", "model:bench")
    for n in range(l1.max_entries):
        store.put_nowait(f"v1:t:bench:default:0:chat:{n:064x}", b"%0500d" % n, ttl=l1.ttl_s, tags=tags, cost=0.5)
        store.get_nowait(f"v1:t:bench:default:0:chat:{n // 2:064x}")
    gc.collect()
    pauses = []
    for _ in range(rounds):
        started = time.perf_counter()
        gc.collect()
        pauses.append((time.perf_counter() - started) * 1000)
    gc.unfreeze()
    return statistics.median(pauses)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench l1")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import tempfile

    env = {"RAGPROXY_CACHE__L2__ENABLED": "false", "RAGPROXY_CACHE__L3__ENABLED": "false",
           "RAGPROXY_DATA_DIR": tempfile.mkdtemp(prefix="ragproxy-bench-")}
    results = run(env, args.quick, "l1")
    results["gc_full_ms"] = full_collection_ms()
    for key, value in results.items():
        print(f"{key:16s} {value:10.3f}")
    if args.json:
        print(json.dumps({k: round(v, 4) for k, v in results.items()}))
    return 0


def _serve_bare(port: int) -> None:
    from loadtest.trivial_upstream import ANSWER

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(bare_app(ANSWER), host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-bare":
        _serve_bare(int(sys.argv[2]))
    else:
        raise SystemExit(main(sys.argv[1:]))
