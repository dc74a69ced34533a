"""``python -m loadtest.bench kv_load [--quick] [--json]``: goodput at a TTFT objective on real llama-server
replicas under open-loop load, direct round-robin vs through the proxy.

Two sets of replicas with the same flags (:mod:`loadtest.bench.kv`: ``--replicas`` 2, ``--slots`` 2, model
``--shape``), one per side, started once; the proxy side's KV layer (knowledge trees, prefill models, router,
admission queues) lives as long as its replicas, as a running proxy's does.

1. **Calibration** — the sequential benchmark's phases (:func:`loadtest.bench.kv.sequential`: warm-up, then
   measured requests, one at a time, each direct then through the proxy). It warms both sides' caches, fits the
   proxy's prefill model, and gives what the load runs are scaled by: the direct side's unloaded TTFT p50 (the
   objective is ``--slo-factor`` times it, unless ``--slo-ms``) and its unloaded service rate, 1 / its mean TTFT
   (one replica's worth: on one GPU, or on CPU cores shared with other work, the replicas compete for the same
   compute). Its figures — TTFT, reuse, the prefill share of TTFT, host prompt-cache time — are printed as the
   sequential bench does.
2. **Load runs** — for each rate, both sides get the same requests at the same Poisson send times
   (:func:`loadtest.goodput.poisson_arrivals`), ``--duration`` seconds of them in ``--chunks`` turns: a turn of
   one side, then the same turn of the other (which goes first alternates), each starting on idle replicas, so
   that both see the same drift of a shared machine. A request
   unanswered ``--give-up`` times the objective after it was sent is abandoned (the client disconnects;
   llama-server then cancels it) and counts as late. The rates: ``--low-load`` service rates first (where TTFT p99
   is compared), then a search for the direct side's knee from ``--start`` service rates (:func:`next_rate`: up
   or down by 1.6x until it is bracketed, then halving the bracket; at most ``--probes`` rates after the start),
   so the ratio below is read near the knee, not a grid step before it — or the ``--rates`` given.

The proxy side runs with the objective as its ``ttft_slo_s``: requests no replica can serve in time are refused
with 429 (:data:`~loadtest.goodput.REJECTED`), which is never goodput and is reported apart. The direct side
sends everything; what is late is late.

Workload: the sequential bench's (Zipf-popular documents shared by all users, top-k 3-5 in a retrieval order
drawn at random per request, a fresh question each), continued from where the calibration stopped: each run
gets the next requests. The retrieval order does not follow popularity or any rule the proxy uses.

Figures per rate and side (:func:`loadtest.goodput.run_figures`): goodput (requests/s answered within the
objective), attainment, TTFT p50/p99 of the answered ones, refusals, late, prompt-token reuse and prefill share
(the server's ``timings``). Headline: ``goodput_ratio`` = proxy / direct goodput at the highest rate where the
direct side answers at least half within the objective (:func:`loadtest.goodput.goodput_ratio`); beside it
``ttft_p99_ratio_low_load`` (proxy / direct TTFT p99 at the lowest rate) and ``reuse_vs_ceiling`` (the proxy's
reuse over all load runs against :func:`loadtest.bench.kv.prefix_reuse_ceiling` of the same requests).

Decode is not part of it: every request asks for one token, so a slot is busy for the prefill only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from dataclasses import asdict
from typing import Protocol

from loadtest.bench.kv import (
    DirectSide,
    ProxySide,
    Sequential,
    Servers,
    Workload,
    _client,
    add_server_options,
    ensure_binaries,
    exit_on_sigterm,
    make_workload,
    prefix_reuse_ceiling,
    print_phases,
    sequential,
    start_servers,
)
from loadtest.goodput import ERROR, LATE, Outcome, RunFigures, goodput_ratio, poisson_arrivals, run_figures
from proxy.kv.order import OrderPolicy


class Side(Protocol):
    async def send(self, index: int) -> Outcome: ...


async def open_loop(side: Side, first: int, arrivals: list[float], give_up_s: float) -> list[Outcome]:
    """Send request ``first + k`` at ``arrivals[k]`` seconds from now, whatever the earlier ones are doing."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(index: int) -> Outcome:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(give_up_s):
                return await side.send(index)
        except TimeoutError:
            return Outcome(LATE, time.perf_counter() - started)
        except Exception:  # a failed request is counted, not fatal to the run
            return Outcome(ERROR, time.perf_counter() - started)

    tasks = []
    for k, at in enumerate(arrivals):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(first + k)))
    return list(await asyncio.gather(*tasks))


def next_rate(direct: dict[float, RunFigures], start: float, step: float = 1.6, precision: float = 0.1,
              threshold: float = 0.5) -> float | None:
    """The next rate to offer, searching for the direct side's knee (the highest rate where it answers
    ``threshold`` of the requests within the objective): ``start`` first; then ``step`` times higher while it
    meets the objective everywhere, ``step`` times lower while it meets it nowhere; then halfway between the
    highest rate where it did and the lowest rate above where it did not, until they are within ``precision``
    (``None``: found)."""
    if not direct:
        return start
    passing = [r for r, f in direct.items() if f.attainment >= threshold]
    if not passing:
        return round(min(direct) / step, 3)
    best = max(passing)
    above = [r for r, f in direct.items() if r > best]
    if not above:
        return round(best * step, 3)
    low = min(above)
    return round((best + low) / 2, 3) if low > best * (1 + precision) else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench kv_load")
    parser.add_argument("--quick", action="store_true", help="fewer documents, rates and seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--docs", type=int, help="corpus size (quick 10, else 24)")
    parser.add_argument("--doc-words", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calibration", type=int, help="sequential warm-up and measured requests each (quick 8, "
                                                         "else 16)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals per rate and side (quick 12, else 36)")
    parser.add_argument("--chunks", type=int, help="turns per rate: each side gets the rate's seconds in this many "
                                                   "runs, alternating with the other side (quick 2, else 3)")
    parser.add_argument("--rates", help="offered rates in requests/s, comma-separated (default: a low-load rate, "
                                        "then a search for the direct side's knee)")
    parser.add_argument("--low-load", type=float, default=0.3,
                        help="the first rate, in unloaded service rates (1 / the direct side's unloaded mean TTFT)")
    parser.add_argument("--start", type=float, default=1.0, help="where the search starts, in service rates")
    parser.add_argument("--probes", type=int, help="rates the search may add after the start (quick 3, else 5)")
    parser.add_argument("--slo-ms", type=float, help="the TTFT objective (default: --slo-factor x the direct "
                                                     "side's unloaded TTFT p50)")
    parser.add_argument("--slo-factor", type=float, default=3.0)
    parser.add_argument("--give-up", type=float, default=4.0, help="abandon a request after this many objectives")
    parser.add_argument("--order", choices=["reuse", "shift"], default="reuse")
    add_server_options(parser)
    args = parser.parse_args(argv)
    docs = args.docs or (10 if args.quick else 24)
    calibration = args.calibration or (8 if args.quick else 16)
    duration = args.duration or (12.0 if args.quick else 36.0)
    chunks = max(1, args.chunks or (2 if args.quick else 3))
    probes = args.probes if args.probes is not None else (3 if args.quick else 5)
    server, model = ensure_binaries(args.shape, args.weight_type, args.model)
    exit_on_sigterm()
    started = time.perf_counter()
    direct_servers = start_servers(args, server, model)
    proxy_servers = start_servers(args, server, model)
    try:
        direct_servers.wait_ready(300)
        proxy_servers.wait_ready(300)
        result = asyncio.run(_run(args, docs, calibration, duration, chunks, probes, direct_servers,
                                  proxy_servers))
    finally:
        direct_servers.stop()
        proxy_servers.stop()
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result))
    return 0


async def _run(
    args: argparse.Namespace, docs: int, calibration: int, duration: float, chunks: int, probes: int,
    direct_servers: Servers, proxy_servers: Servers,
) -> dict[str, object]:
    work = make_workload(docs=docs, requests=2 * calibration, doc_words=args.doc_words, seed=args.seed)
    async with _client() as client:
        direct = DirectSide(direct_servers.urls, work, client)
        proxy = ProxySide(proxy_servers.urls, work, client, slots=args.slots, ctx_per_slot=args.ctx_per_slot,
                          policy=OrderPolicy(args.order), prompt_cache=args.cache_ram != 0)
        calib = await sequential(direct_servers, proxy_servers, direct, proxy, calibration, calibration)
        unloaded_ms = statistics.median(o.ttft_s for o in calib.steady.direct) * 1000
        slo_s = (args.slo_ms if args.slo_ms else args.slo_factor * unloaded_ms) / 1000
        service = 1 / statistics.mean(o.ttft_s for o in calib.steady.direct)
        fixed = [float(r) for r in args.rates.split(",")] if args.rates else []
        proxy.set_objective(slo_s)
        _print_calibration(args, calib, unloaded_ms, slo_s, service)
        # the workload, long enough for every run (make_workload extends the same sequence)
        highest = max([*fixed, args.start * service * 1.6 ** probes])
        needed = 2 * calibration + (len(fixed) or probes + 2) * math.ceil(highest * duration * 1.5 + 20 * chunks)
        work = make_workload(docs=docs, requests=needed, doc_words=args.doc_words, seed=args.seed)
        direct.work = proxy.work = work
        first = 2 * calibration
        direct_figures: dict[float, RunFigures] = {}
        proxy_figures: dict[float, RunFigures] = {}
        proxy_outcomes: list[Outcome] = []
        ranges: list[tuple[int, int]] = []
        give_up_s = args.give_up * slo_s
        client_cpu = {"direct": 0.0, "proxy": 0.0}
        """CPU seconds of this process (the load generator, and the proxy's stages on the proxy side) per side."""
        print(f"  {'rate/s':>7} | {'direct: goodput':>15} {'in SLO':>6} {'p50':>6} {'p99':>6} {'reuse':>5} | "
              f"{'proxy: goodput':>14} {'in SLO':>6} {'429':>4} {'p50':>6} {'p99':>6} {'reuse':>5} {'est.':>5} | "
              "ratio")
        queue = fixed or [round(args.low_load * service, 3), round(args.start * service, 3)]
        searching = not fixed
        while queue or (searching and probes > 0):
            if queue:
                rate = queue.pop(0)
            else:
                found = next_rate(direct_figures, round(args.start * service, 3))
                if found is None or found in direct_figures:
                    break
                rate, probes = found, probes - 1
            outcomes: dict[str, list[Outcome]] = {"direct": [], "proxy": []}
            estimated_from = len(proxy.estimates)
            for chunk in range(chunks):  # both sides in turn, chunk by chunk: the same drift of the machine on both
                arrivals = poisson_arrivals(rate, duration / chunks, random.Random(f"{args.seed}-{rate}-{chunk}"))
                sides: list[tuple[str, Servers, Side]] = [("direct", direct_servers, direct),
                                                          ("proxy", proxy_servers, proxy)]
                if (len(direct_figures) + chunk) % 2:
                    sides.reverse()
                for name, servers, side in sides:
                    await servers.wait_idle(client)
                    cpu = time.process_time()
                    outcomes[name] += await open_loop(side, first, arrivals, give_up_s)
                    client_cpu[name] += time.process_time() - cpu
                ranges.append((first, first + len(arrivals)))
                first += len(arrivals)
            direct_figures[rate] = run_figures(rate, duration, outcomes["direct"], slo_s)
            proxy_figures[rate] = run_figures(rate, duration, outcomes["proxy"], slo_s)
            proxy_outcomes += outcomes["proxy"]
            errors = [measured / estimated for estimated, measured in proxy.estimates[estimated_from:] if estimated]
            _print_rate(direct_figures[rate], proxy_figures[rate], statistics.median(errors) if errors else None)
        await direct_servers.wait_idle(client)
        await proxy_servers.wait_idle(client)
    sent = sum(f.sent for f in direct_figures.values()) or 1
    print(f"this process's CPU per request sent (load generator; the proxy's stages too on the proxy side): direct "
          f"{client_cpu['direct'] / sent * 1000:.1f} ms, proxy {client_cpu['proxy'] / sent * 1000:.1f} ms")
    summary = _summary(args, calib, unloaded_ms, slo_s, service, duration, direct_figures, proxy_figures,
                       proxy_outcomes, work, ranges, direct_servers, proxy_servers)
    summary["client_cpu_ms_per_request"] = {k: round(v / sent * 1000, 2) for k, v in client_cpu.items()}
    return summary


def _print_calibration(
    args: argparse.Namespace, calib: Sequential, unloaded_ms: float, slo_s: float, service: float
) -> None:
    print(f"calibration (sequential): {args.replicas} replicas x {args.slots} slots per side, fixed cost "
          f"{calib.fixed_ms:.1f} ms; host prompt-cache updates per request: direct "
          f"{calib.prompt_cache_ms_direct:.1f} ms, proxy {calib.prompt_cache_ms_proxy:.1f} ms")
    print_phases(calib.cold, calib.steady)
    print(f"objective: TTFT <= {slo_s * 1000:.0f} ms ({slo_s * 1000 / unloaded_ms:.1f} x the direct side's "
          f"unloaded p50 {unloaded_ms:.0f} ms); unloaded service rate {service:.2f} requests/s")


def _fmt(value: float | None) -> str:
    return f"{value:6.0f}" if value is not None else "     -"


def _print_rate(d: RunFigures, p: RunFigures, estimate: float | None) -> None:
    ratio = f"{p.goodput_rps / d.goodput_rps:.2f}" if d.goodput_rps else "-"
    est = f"{estimate:5.2f}" if estimate is not None else "    -"
    print(f"  {d.rate:7.2f} | {d.goodput_rps:15.2f} {d.attainment:6.0%} {_fmt(d.ttft_p50_ms)} {_fmt(d.ttft_p99_ms)} "
          f"{d.reuse:5.2f} | {p.goodput_rps:14.2f} {p.attainment:6.0%} {p.rejected:4} {_fmt(p.ttft_p50_ms)} "
          f"{_fmt(p.ttft_p99_ms)} {p.reuse:5.2f} {est} | {ratio}  (sent {d.sent}; late {d.late}/{p.late}, errors "
          f"{d.errors}/{p.errors})", flush=True)


def _summary(
    args: argparse.Namespace, calib: Sequential, unloaded_ms: float, slo_s: float, service: float, duration: float,
    direct: dict[float, RunFigures], proxy: dict[float, RunFigures], proxy_outcomes: list[Outcome],
    work: Workload, ranges: list[tuple[int, int]], direct_servers: Servers, proxy_servers: Servers,
) -> dict[str, object]:
    rate, ratio = goodput_ratio(direct, proxy)
    low = min(direct)
    low_d, low_p = direct[low].ttft_p99_ms, proxy[low].ttft_p99_ms
    p99_ratio = low_p / low_d if low_d and low_p else None
    cached = sum(o.cache_n for o in proxy_outcomes)
    reuse = cached / max(1, cached + sum(o.prompt_n for o in proxy_outcomes))
    # the ceiling over the load runs' requests (every request of the runs, in order, after the calibration's)
    first = ranges[0][0] if ranges else len(work.requests)
    last = ranges[-1][1] if ranges else len(work.requests)
    ceiling = prefix_reuse_ceiling(Workload(work.system, work.documents, work.requests[:last]), first)
    print(f"goodput_ratio (proxy / direct at {rate} requests/s, the highest rate where direct meets the objective "
          f"for half the requests): {ratio if ratio is None else round(ratio, 2)}")
    print(f"TTFT p99 at the lowest rate, proxy / direct: {p99_ratio if p99_ratio is None else round(p99_ratio, 2)}; "
          f"reuse over the load runs {reuse:.3f} against a ceiling of {ceiling:.3f}")
    calibration = {**calib.steady.summary(), "fixed_cost_ms": round(calib.fixed_ms, 1),
                   "prompt_cache_ms_per_request": round(calib.prompt_cache_ms_proxy, 1),
                   "prompt_cache_ms_per_request_direct": round(calib.prompt_cache_ms_direct, 1)}
    return {
        "bench": "kv-load",
        "shape": args.model.name if args.model else f"{args.shape}-{args.weight_type}",
        "replicas": args.replicas,
        "slots_per_replica": args.slots,
        "server_args": args.server_arg,
        "order": args.order,
        "duration_s": duration,
        "slo_ms": round(slo_s * 1000, 1),
        "unloaded_ttft_p50_direct_ms": round(unloaded_ms, 1),
        "service_rate_rps": round(service, 3),
        "calibration": calibration,
        "rates": [{"rate": r, "direct": _rounded(direct[r]), "proxy": _rounded(proxy[r])} for r in sorted(direct)],
        "goodput_ratio": None if ratio is None else round(ratio, 3),
        "goodput_ratio_rate": rate,
        "ttft_p99_ratio_low_load": None if p99_ratio is None else round(p99_ratio, 3),
        "prefix_token_reuse_load": round(reuse, 3),
        "prefix_token_reuse_ceiling_load": round(ceiling, 3),
        "reuse_vs_ceiling": round(reuse / ceiling, 3) if ceiling else None,
        "prompt_cache_ms_total_direct": round(sum(direct_servers.prompt_cache_updates_ms())),
        "prompt_cache_ms_total_proxy": round(sum(proxy_servers.prompt_cache_updates_ms())),
    }


def _rounded(figures: RunFigures) -> dict[str, object]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(figures).items()}
