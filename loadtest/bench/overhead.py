"""``python -m loadtest.bench overhead [--quick] [--json]``: what the proxy adds to a request.

A trivial upstream and the proxy (caches off: pure pass-through) run as separate processes; the same client measures,
in one run and interleaved (each figure is gathered in rounds that alternate the paths, so drift on a shared machine
hits them alike), direct vs through-proxy latency (p50/p99) at concurrency 1, throughput at 16 and 64, and the time
to the first streamed chunk.

The same run also measures a reference, ``floor_*``: :mod:`loadtest.bare_forwarder`, the proxy's own HTTP server
(:mod:`proxy.server`) and forwarding client with nothing between them. It is what any proxy built on this stack pays per
request on the machine at hand; ragproxy's own share is the difference between ``proxy_*`` and ``floor_*``.

With ``nginx`` installed (``apt-get install nginx-light``), a second reference, ``nginx_*``: the same requests
through nginx, one process, pooled keep-alive upstream connections, buffering off (:mod:`loadtest.reference_proxy`).
It is what a hop through a proxy written in C costs on the machine at hand: the part of ``added_p50_ms_c1`` that no
proxy process avoids (two more wake-ups and four more socket calls per request). Without nginx the run says so on
stderr and leaves these figures out.

``proxy_cpu_us_c64``, ``floor_cpu_us_c64`` (and ``nginx_cpu_us_c64``): CPU time (user + system, from ``/proc``)
each forwarding process spent per request during the concurrency-64 rounds. Unlike throughput, which depends on how
the processes share the cores at that moment, CPU per request moves less with the machine's load: it is the figure
to compare across changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import ExitStack

import aiohttp

from loadtest.harness import child, closed_loop, cpu_seconds, free_port, percentiles, proxy_child
from loadtest.reference_proxy import nginx_available, nginx_proxy

BODY = b'{"model":"bench","messages":[{"role":"user","content":"What does a proxy do?"}]}'
STREAM_BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"What does a proxy do?"}]}'


async def _measure(bases: dict[str, str], quick: bool, pids: dict[str, int]) -> dict[str, float]:
    """``bases``: "direct", "proxy", "floor" and maybe "nginx", each a base URL; ``pids``: the forwarding processes."""
    results: dict[str, float] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        def caller(base: str, body: bytes) -> object:
            async def call() -> None:
                async with session.post(base + "/v1/chat/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    assert response.status == 200
            return call

        paths = tuple(bases.items())
        for _, base in paths:  # warm every path
            await closed_loop(caller(base, BODY), 4, 200)  # type: ignore[arg-type]
        rounds = 3 if quick else 5
        single = 300 if quick else 1000
        lat: dict[str, list[float]] = {name: [] for name, _ in paths}
        for _ in range(rounds):
            for name, base in paths:
                _, samples = await closed_loop(caller(base, BODY), 1, single // rounds)  # type: ignore[arg-type]
                lat[name].extend(samples)
        d, p = percentiles(lat["direct"]), percentiles(lat["proxy"])
        results.update({"direct_p50_ms_c1": d["p50_ms"], "direct_p99_ms_c1": d["p99_ms"],
                        "proxy_p50_ms_c1": p["p50_ms"], "proxy_p99_ms_c1": p["p99_ms"],
                        "added_p50_ms_c1": p["p50_ms"] - d["p50_ms"], "added_p99_ms_c1": p["p99_ms"] - d["p99_ms"]})
        for name in ("floor", "nginx"):
            if name in lat:
                r = percentiles(lat[name])
                results.update({f"{name}_p50_ms_c1": r["p50_ms"], f"{name}_added_p50_ms_c1": r["p50_ms"] - d["p50_ms"]})
        for concurrency in (16, 64):
            per_round = (1500 if quick else 6000) // rounds
            elapsed = {name: 0.0 for name, _ in paths}
            cpu = {name: 0.0 for name in pids}
            for _ in range(rounds):  # interleaved like the latency rounds: drift on a shared machine hits all paths
                for name, base in paths:
                    before = cpu_seconds(pids[name]) if name in pids else 0.0
                    rate, _ = await closed_loop(caller(base, BODY), concurrency, per_round)  # type: ignore[arg-type]
                    elapsed[name] += per_round / rate
                    if name in pids:
                        cpu[name] += cpu_seconds(pids[name]) - before
            rps = {name: per_round * rounds / seconds for name, seconds in elapsed.items()}
            if concurrency == 64:
                for name, seconds in cpu.items():
                    results[f"{name}_cpu_us_c64"] = seconds / (per_round * rounds) * 1e6
            results[f"direct_rps_c{concurrency}"] = rps["direct"]
            results[f"proxy_rps_c{concurrency}"] = rps["proxy"]
            results[f"throughput_ratio_c{concurrency}"] = rps["proxy"] / rps["direct"]
            for name in ("floor", "nginx"):
                if name in rps:
                    results[f"{name}_rps_c{concurrency}"] = rps[name]
                    results[f"{name}_throughput_ratio_c{concurrency}"] = rps[name] / rps["direct"]
        streaming = [(name, base) for name, base in paths if name != "floor"]  # the floor does not stream
        ttfb: dict[str, list[float]] = {name: [] for name, _ in streaming}
        for _ in range(20 if quick else 60):
            for name, base in streaming:
                started = time.perf_counter()
                async with session.post(base + "/v1/chat/completions", data=STREAM_BODY,
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.content.readany()
                    ttfb[name].append(time.perf_counter() - started)
                    await response.read()
        results["stream_ttfb_direct_ms"] = percentiles(ttfb["direct"])["p50_ms"]
        results["stream_ttfb_proxy_ms"] = percentiles(ttfb["proxy"])["p50_ms"]
        results["stream_ttfb_added_ms"] = results["stream_ttfb_proxy_ms"] - results["stream_ttfb_direct_ms"]
        if "nginx" in ttfb:
            results["nginx_stream_ttfb_added_ms"] = (percentiles(ttfb["nginx"])["p50_ms"]
                                                     - results["stream_ttfb_direct_ms"])
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench overhead")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    port = free_port()
    with child(["-m", "loadtest.trivial_upstream", "--port", str(port)], port):
        upstream = f"http://127.0.0.1:{port}"
        env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": upstream}]), "RAGPROXY_CACHE__ENABLED": "false",
               "RAGPROXY_ADMIN__ENABLED": "false"}
        floor_port = free_port()
        with ExitStack() as stack:
            proxied, proxy = stack.enter_context(proxy_child(env))
            bare = stack.enter_context(child(["-m", "loadtest.bare_forwarder", "--port", str(floor_port),
                                              "--upstream", upstream], floor_port))
            bases = {"direct": upstream, "proxy": proxied, "floor": f"http://127.0.0.1:{floor_port}"}
            pids = {"proxy": proxy.pid, "floor": bare.pid}
            if nginx_available():
                nginx_port = free_port()
                nginx = stack.enter_context(nginx_proxy(nginx_port, f"127.0.0.1:{port}"))
                bases["nginx"], pids["nginx"] = f"http://127.0.0.1:{nginx_port}", nginx.pid
            else:
                print("nginx not found (apt-get install nginx-light): no nginx_* reference figures", file=sys.stderr)
            results = asyncio.run(_measure(bases, args.quick, pids))
    for key, value in results.items():
        print(f"{key:28s} {value:10.3f}")
    if args.json:
        print(json.dumps({k: round(v, 4) for k, v in results.items()}))
    return 0
