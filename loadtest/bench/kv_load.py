"""``python -m loadtest.bench kv_load [--quick] [--json]``: goodput and capacity at a TTFT objective on real
llama-server replicas under open-loop load: direct round-robin, SGLang's gateway (smg), the proxy, and the proxy
keeping retrieval order.

A set of replicas per side with the same flags (:mod:`loadtest.bench.kv`: ``--replicas`` 2, ``--slots`` 2, model
``--shape``; ``--sides`` as there), started once; a proxy side's KV layer (knowledge trees, prefill models,
router, admission queues) lives as long as its replicas, as a running proxy's does, and smg's tree as long as
its gateway.

1. **Calibration** — the sequential benchmark's phases (:func:`loadtest.bench.kv.sequential`: warm-up, then
   measured requests, one at a time, each to every side in turn). It warms every side's caches, fits the
   proxy's prefill model, and gives what the load runs are scaled by: the direct side's unloaded TTFT p50 (the
   objective is ``--slo-factor`` times it, unless ``--slo-ms``) and its unloaded service rate, 1 / its mean TTFT
   (one replica's worth: on one GPU, or on CPU cores shared with other work, the replicas compete for the same
   compute).
2. **Load runs** — for each rate, every side gets the same requests at the same Poisson send times
   (:func:`loadtest.goodput.poisson_arrivals`), ``--duration`` seconds of them in ``--chunks`` repeats: a repeat
   of each side in turn (which goes first rotates), each starting on idle replicas, so that all see the same
   drift of a shared machine; a sweep's lowest rate, where TTFT p99 is compared, gets ``--low-load-seconds``
   times as many seconds (3: 60-100 requests per side on a quiet 2-core machine, so that p99 is not just the
   slowest one). A sweep runs repeat 1 of every rate, then repeat 2, and so on: a burst of other work on the
   machine then hits one repeat of a few rates, which the bootstrap sees, not every repeat of one.
   A request unanswered ``--give-up`` times the objective after it was sent is abandoned (the client
   disconnects) and counts as late. The rates: a sweep (``--sweep``, in unloaded service rates, from low load to
   past every side's knee), or the ``--rates`` given, or with ``--search`` the earlier search for the direct
   side's knee (:func:`next_rate`), which runs a rate's repeats one after the other.

The proxy's sides run with the objective as their ``ttft_slo_s``: requests no replica can serve in time are
refused with 429 (:data:`~loadtest.goodput.REJECTED`), never goodput, reported apart: in all, and split by the
429's error code into those refused at arrival (``ttft_slo``: no replica expected to start them in time) and those
refused after waiting (``ttft_slo_queued``: dropped from a replica's queue once they could no longer start in time).
Direct and smg send everything; what is late is late.

The product runs as users run it on the ``serve`` side: a ``ragproxy serve`` process (:mod:`loadtest.bench._kv_serve`)
over HTTP, with ``routing.ttft_slo_s`` only when ``--slo-ms`` is given (the objective is otherwise known only after
the calibration, and the process lives as long as its replicas). The ``proxy`` and ``preserve`` sides run the KV
stages in this process: a diagnostic of what the layer decides, with its trees' predictions checked against the
servers' reports.

Workload (``--workload``, ``--present``; :mod:`loadtest.bench._kv_workload`): the sequential bench's
(``synthetic``: Zipf-popular documents shared by all users, top-k 3-5 in a retrieval order drawn at random per
request, a fresh question each) or ``zipf-rag`` (real prose, top 5, streamed), structured, pasted or joined, continued
from where the calibration stopped: each run gets the next requests.

Headline: **capacity** per side (:mod:`loadtest.capacity`): the highest rate at which ``--target`` (0.9) of the
requests are answered within the objective, fitted across the sweep's rates and repeats, with a paired bootstrap
interval over the repeats; ``capacity_ratio_vs_smg`` (proxy / smg) and its interval; with the ``fleet`` side,
``capacity_ratio_vs_one_proxy`` (``--proxies`` proxies in shared mode / one, ``serve``, in front of as many replicas)
and its interval ``capacity_ratio_vs_one_proxy_ci``. Detail, per rate and side
(:func:`loadtest.goodput.run_figures`): goodput, attainment, TTFT p50/p99 of the answered ones, refusals (429: all,
at arrival, after waiting), late, prompt-token reuse; ``goodput_ratio`` (proxy / direct at the highest rate where
direct answers half in time), ``ttft_p99_ratio_low_load`` (at the lowest rate, against direct and smg), and the
reuse of every side over the load runs against :func:`loadtest.bench._kv_reuse.prefix_reuse_ceiling` of the same
requests, and the prefill bound of those requests in time (``prefill_bound_time``, :mod:`loadtest.bench._kv_bound`:
smg's prefill, else direct's, over the prefill with the ceiling's reuse, priced by the proxy's prefill model fitted
to the calibration's sequential timings — under load a request's ``prompt_ms`` also holds the other slots' prompts
batched with it) beside the same ratio in tokens computed (``prefill_bound_tokens``).

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
from typing import Any

from loadtest.bench._kv_bound import PrefillBound, peer_side, prefill_bound
from loadtest.bench._kv_contextpilot import ContextPilotSide
from loadtest.bench._kv_rag import chosen_workload
from loadtest.bench._kv_reuse import ceiling_tokens, prefix_reuse_ceiling, reuse_losses, reuse_share
from loadtest.bench._kv_servers import ensure_binaries, exit_on_sigterm
from loadtest.bench._kv_sides import (
    SIDE_KINDS,
    Fleet,
    ProxySide,
    Side,
    add_server_options,
    chosen_sides,
    open_loop_client,
)
from loadtest.bench._kv_workload import Workload
from loadtest.bench.kv import Sequential, print_phases, sequential
from loadtest.capacity import Sweep, bootstrap, capacity_ratio, fit_capacity, percentile_interval
from loadtest.goodput import (
    ERROR,
    LATE,
    OK,
    Outcome,
    RunFigures,
    goodput_ratio,
    poisson_arrivals,
    run_figures,
)


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


QUICK_SWEEP, FULL_SWEEP = "0.3,0.6,0.85,1.2,1.7,2.4,3.4,4.8", "0.3,0.45,0.65,0.9,1.25,1.75,2.5,3.5,5.0"
"""The capacity sweep's rates, in unloaded service rates: from low load to well past every side's knee (the
lowest is where TTFT p99 is compared)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench kv_load")
    parser.add_argument("--quick", action="store_true", help="fewer documents, rates and seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--docs", type=int, help="corpus size (synthetic: quick 10, else 24; zipf-rag 40)")
    parser.add_argument("--doc-words", type=int, help="words per document (synthetic 200, zipf-rag 150)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calibration", type=int, help="sequential warm-up and measured requests each (quick 8, "
                                                         "else 16)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals per rate and side (quick 18, else 36)")
    parser.add_argument("--low-load-seconds", type=float, default=3.0,
                        help="the lowest rate of a sweep gets this many times --duration: TTFT p99 is compared "
                             "there, and a p99 of a dozen requests is only the slowest one")
    parser.add_argument("--chunks", type=int, help="repeats per rate: each side gets the rate's seconds in this many "
                                                   "runs, in turn with the other sides (quick 3, else 4)")
    parser.add_argument("--rates", help="offered rates in requests/s, comma-separated (default: --sweep)")
    parser.add_argument("--sweep", help=f"offered rates in unloaded service rates (quick {QUICK_SWEEP}, else "
                                        f"{FULL_SWEEP})")
    parser.add_argument("--search", action="store_true",
                        help="instead of the sweep: a low-load rate, then a search for the direct side's knee")
    parser.add_argument("--low-load", type=float, default=0.3,
                        help="with --search, the first rate, in unloaded service rates (1 / the direct side's "
                             "unloaded mean TTFT)")
    parser.add_argument("--start", type=float, default=1.0, help="with --search, where it starts, in service rates")
    parser.add_argument("--probes", type=int, help="rates the search may add after the start (quick 3, else 5)")
    parser.add_argument("--slo-ms", type=float, help="the TTFT objective (default: --slo-factor x the direct "
                                                     "side's unloaded TTFT p50)")
    parser.add_argument("--slo-factor", type=float, default=3.0)
    parser.add_argument("--give-up", type=float, default=4.0, help="abandon a request after this many objectives")
    parser.add_argument("--target", type=float, default=0.9,
                        help="capacity: the highest rate at which this share is answered within the objective")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the repeats")
    parser.add_argument("--order", choices=["reuse", "shift"], default="reuse")
    add_server_options(parser)
    args = parser.parse_args(argv)
    docs = args.docs or (None if args.workload == "zipf-rag" else 10 if args.quick else 24)
    calibration = args.calibration or (8 if args.quick else 16)
    duration = args.duration or (18.0 if args.quick else 36.0)
    chunks = max(1, args.chunks or (3 if args.quick else 4))
    probes = args.probes if args.probes is not None else (3 if args.quick else 5)
    server, model = ensure_binaries(args.shape, args.weight_type, args.model)
    exit_on_sigterm()
    started = time.perf_counter()
    fleet = Fleet(args, server, model, chosen_sides(args.sides))
    try:
        fleet.wait_ready()
        result = asyncio.run(_run(args, docs, calibration, duration, chunks, probes, fleet))
    finally:
        fleet.stop()
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result))
    return 0


async def _run(
    args: argparse.Namespace, docs: int | None, calibration: int, duration: float, chunks: int, probes: int,
    fleet: Fleet,
) -> dict[str, object]:
    work = chosen_workload(args, docs=docs, requests=2 * calibration)
    async with open_loop_client() as client:
        sides = fleet.sides(work, client)
        proxy = sides["proxy"]
        assert isinstance(proxy, ProxySide)
        calib = await sequential(fleet.servers, sides, calibration, calibration)
        unloaded_ms = statistics.median(o.ttft_s for o in calib.steady.direct) * 1000
        slo_s = (args.slo_ms if args.slo_ms else args.slo_factor * unloaded_ms) / 1000
        service = 1 / statistics.mean(o.ttft_s for o in calib.steady.direct)
        if args.rates:
            fixed = [float(r) for r in args.rates.split(",")]
        elif args.search:
            fixed = []
        else:
            sweep = args.sweep or (QUICK_SWEEP if args.quick else FULL_SWEEP)
            fixed = [round(float(m) * service, 3) for m in sweep.split(",")]
        for side in sides.values():
            if isinstance(side, ProxySide):
                side.set_objective(slo_s)
        _print_calibration(args, calib, unloaded_ms, slo_s, service)
        # the workload, long enough for every run (a longer one extends the same sequence)
        highest = max([*fixed, args.start * service * 1.6 ** probes])
        needed = 2 * calibration + (len(fixed) or probes + 2) * math.ceil(highest * duration * 1.5 + 20 * chunks)
        needed += math.ceil(min(fixed, default=0.0) * duration * args.low_load_seconds * 1.5)
        work = chosen_workload(args, docs=docs, requests=needed)
        for side in sides.values():
            side.work = work
        first = 2 * calibration
        figures: dict[str, dict[float, RunFigures]] = {name: {} for name in sides}
        trials: dict[str, dict[float, list[tuple[int, int]]]] = {name: {} for name in sides}
        """Per side and rate, ``(answered within the objective, sent)`` of each repeat (chunk)."""
        load_outcomes: dict[str, list[Outcome]] = {name: [] for name in sides}
        indexed: dict[str, list[tuple[int, Outcome]]] = {name: [] for name in sides}
        """Per side, every load-run outcome with its workload index."""
        ranges: list[tuple[int, int]] = []
        give_up_s = args.give_up * slo_s
        client_cpu = dict.fromkeys(sides, 0.0)
        """CPU seconds of this process (the load generator, and the proxy's stages on its sides) per side."""
        names = list(sides)
        outcomes: dict[float, dict[str, list[Outcome]]] = {}
        estimate_errors: dict[float, list[float]] = {}

        def seconds(rate: float) -> float:
            """Seconds of arrivals at ``rate`` per side: more at a sweep's lowest rate, where p99 is compared."""
            return duration * (args.low_load_seconds if fixed and rate == min(fixed) else 1.0)

        async def repeat(rate: float, chunk: int) -> None:
            """One repeat at ``rate``: the same arrivals to every side in turn (which goes first rotates)."""
            nonlocal first
            got_by_side = outcomes.setdefault(rate, {name: [] for name in names})
            arrivals = poisson_arrivals(rate, seconds(rate) / chunks, random.Random(f"{args.seed}-{rate}-{chunk}"))
            turn = (list(outcomes).index(rate) + chunk) % len(names)
            for name in names[turn:] + names[:turn]:
                await fleet.servers[name].wait_idle(client)
                estimated_from = len(proxy.estimates)
                cpu = time.process_time()
                got = await open_loop(sides[name], first, arrivals, give_up_s)
                client_cpu[name] += time.process_time() - cpu
                indexed[name] += enumerate(got, start=first)
                got_by_side[name] += got
                within = sum(1 for o in got if o.status == OK and o.ttft_s <= slo_s)
                trials[name].setdefault(rate, []).append((within, len(got)))
                if name == "proxy":
                    estimate_errors.setdefault(rate, []).extend(
                        measured / estimated for estimated, measured in proxy.estimates[estimated_from:] if estimated)
            ranges.append((first, first + len(arrivals)))
            first += len(arrivals)

        def finish(rate: float) -> None:
            if not figures["direct"]:
                print(f"  {'rate/s':>7} {'side':<9} {'goodput':>7} {'in SLO':>6} {'429':>4} {'arr.':>4} {'wait':>4} "
                      f"{'late':>4} {'p50':>6} {'p99':>6} {'reuse':>5}  (429: refused in all, at arrival, after "
                      "waiting)")
            for name in names:
                figures[name][rate] = run_figures(rate, seconds(rate), outcomes[rate][name], slo_s)
                load_outcomes[name] += outcomes[rate][name]
            errors = estimate_errors.get(rate)
            _print_rate({name: figures[name][rate] for name in names}, statistics.median(errors) if errors else None)

        if fixed:
            # repeats outer, rates inner: a burst of other work on the machine hits one repeat of a few rates
            # (which the bootstrap over repeats sees), not every repeat of one rate
            for chunk in range(chunks):
                for rate in fixed:
                    await repeat(rate, chunk)
                print(f"  (repeat {chunk + 1} of {chunks} done)", flush=True)
            for rate in fixed:
                finish(rate)
        else:
            queue = [round(args.low_load * service, 3), round(args.start * service, 3)]
            while queue or probes > 0:
                if queue:
                    rate = queue.pop(0)
                else:
                    found = next_rate(figures["direct"], round(args.start * service, 3))
                    if found is None or found in figures["direct"]:
                        break
                    rate, probes = found, probes - 1
                for chunk in range(chunks):
                    await repeat(rate, chunk)
                finish(rate)
        for servers in fleet.servers.values():
            await servers.wait_idle(client)
    sent = sum(f.sent for f in figures["direct"].values()) or 1
    print("this process's CPU per request sent (load generator; the proxy's stages too on its sides): "
          + ", ".join(f"{name} {cpu / sent * 1000:.1f} ms" for name, cpu in client_cpu.items()))
    ceiling = ceiling_tokens(work)
    # the model is fitted to the calibration's sequential timings: under load a request's prompt_ms also holds the
    # other slots' prompts computed in the same batches
    peer = peer_side(sides)
    bound = prefill_bound(calib.timing_rows(), peer, indexed[peer], ceiling)
    summary = _summary(args, calib, unloaded_ms, slo_s, service, duration, figures, load_outcomes, work, ranges,
                       fleet, bound)
    summary.update(_capacity(args, trials, chunks))
    summary.update(_by_side(args, sides, summary))
    losses = reuse_losses(proxy.routed, ranges[0][0] if ranges else len(work.requests), ceiling)
    print("proxy's reuse over the load runs, estimated tokens (ceiling / one cache, its order / same replica / "
          "predicted / reported): " + " / ".join(f"{value:.3f}" for value in losses.values()))
    summary["reuse_losses"] = losses
    trees = [{"evictions": r.tree.evictions, "forgotten_tokens": r.tree.forgotten_tokens,
              "size_tokens": r.tree.size_tokens, "capacity_tokens": r.tree.capacity_tokens} for r in proxy.replicas]
    under = sum(r.reported > r.predicted + proxy.replicas[r.replica].tree.tolerance_tokens for r in proxy.routed)
    print(f"proxy's knowledge trees: {trees}; requests whose expectation as they started was above the report: "
          f"{proxy.over_predicted_share} (the tree's prediction at routing time: "
          f"{proxy.over_predicted_at_route_share}), below it: {round(under / max(1, len(proxy.routed)), 3)}")
    summary["proxy_trees"] = trees
    choices = {name: servers.slot_choices() for name, servers in fleet.servers.items()}
    print("how the replicas chose each request's slot (id: pinned by the proxy, LCP: similarity, LRU): "
          + ", ".join(f"{name} {counts}" for name, counts in choices.items()))
    summary["slot_choices"] = choices
    summary["over_predicted_share"] = proxy.over_predicted_share
    summary["over_predicted_at_route_share"] = proxy.over_predicted_at_route_share
    summary["client_cpu_ms_per_request"] = {k: round(v / sent * 1000, 2) for k, v in client_cpu.items()}
    return summary


def _print_calibration(
    args: argparse.Namespace, calib: Sequential, unloaded_ms: float, slo_s: float, service: float
) -> None:
    print(f"calibration (sequential): {args.replicas} replicas x {args.slots} slots per side, fixed cost "
          f"{calib.fixed_ms:.1f} ms; host prompt-cache updates per request: "
          + ", ".join(f"{name} {ms:.1f} ms" for name, ms in calib.prompt_cache_ms.items()))
    print_phases(calib.cold, calib.steady)
    print(f"objective: TTFT <= {slo_s * 1000:.0f} ms ({slo_s * 1000 / unloaded_ms:.1f} x the direct side's "
          f"unloaded p50 {unloaded_ms:.0f} ms); unloaded service rate {service:.2f} requests/s")


def _fmt(value: float | None) -> str:
    return f"{value:6.0f}" if value is not None else "     -"


def _print_rate(figures: dict[str, RunFigures], estimate: float | None) -> None:
    for name, f in figures.items():
        est = f"  estimates {estimate:.2f}x short" if name == "proxy" and estimate is not None else ""
        print(f"  {f.rate:7.2f} {name:<9} {f.goodput_rps:7.2f} {f.attainment:6.0%} {f.rejected:4} "
              f"{f.rejected_at_arrival:4} {f.rejected_after_wait:4} {f.late:4} "
              f"{_fmt(f.ttft_p50_ms)} {_fmt(f.ttft_p99_ms)} {f.reuse:5.2f}{est}"
              + (f"  (sent {f.sent}, errors {f.errors})" if name == "direct" or f.errors else ""), flush=True)


def _summary(
    args: argparse.Namespace, calib: Sequential, unloaded_ms: float, slo_s: float, service: float, duration: float,
    figures: dict[str, dict[float, RunFigures]], outcomes: dict[str, list[Outcome]], work: Workload,
    ranges: list[tuple[int, int]], fleet: Fleet, bound: PrefillBound,
) -> dict[str, object]:
    direct, proxy = figures["direct"], figures["proxy"]
    rate, ratio = goodput_ratio(direct, proxy)
    low = min(direct)
    low_d, low_p = direct[low].ttft_p99_ms, proxy[low].ttft_p99_ms
    p99_ratio = low_p / low_d if low_d and low_p else None
    smg = figures.get("smg")
    low_s = smg[low].ttft_p99_ms if smg else None
    p99_vs_smg = low_p / low_s if low_s and low_p else None
    below_smg = sorted(r for r in proxy if smg and proxy[r].goodput_rps < smg[r].goodput_rps)
    reuse = {name: round(reuse_share(got), 3) for name, got in outcomes.items()}
    # the ceiling over the load runs' requests (every request of the runs, in order, after the calibration's)
    first = ranges[0][0] if ranges else len(work.requests)
    last = ranges[-1][1] if ranges else len(work.requests)
    ceiling = prefix_reuse_ceiling(Workload(work.system, work.documents, work.requests[:last]), first)
    print(f"goodput_ratio (proxy / direct at {rate} requests/s, the highest rate where direct meets the objective "
          f"for half the requests): {ratio if ratio is None else round(ratio, 2)}")
    print(f"TTFT p99 at the lowest rate ({proxy[low].sent} requests per side), proxy / direct: "
          f"{p99_ratio if p99_ratio is None else round(p99_ratio, 2)}"
          + (f", proxy / smg: {round(p99_vs_smg, 2) if p99_vs_smg else None}" if smg else "")
          + (f"; rates where the proxy's goodput is below smg's: {below_smg}" if smg else ""))
    print("reuse over the load runs: " + ", ".join(f"{name} {value:.3f}" for name, value in reuse.items())
          + f" against a ceiling of {ceiling:.3f}")
    print(f"prefill bound over the load runs: {bound.describe()}")
    calibration = {**calib.steady.summary(), "fixed_cost_ms": round(calib.fixed_ms, 1),
                   "prompt_cache_ms_per_request": round(calib.prompt_cache_ms["proxy"], 1),
                   "prompt_cache_ms_per_request_direct": round(calib.prompt_cache_ms["direct"], 1)}
    return {
        "bench": "kv-load",
        "shape": args.model.name if args.model else f"{args.shape}-{args.weight_type}",
        "replicas": args.replicas,
        "slots_per_replica": args.slots,
        "server_args": args.server_arg,
        "order": args.order,
        "sides": list(figures),
        "duration_s": duration,
        "low_load_duration_s": duration * args.low_load_seconds if not args.search and not args.rates else duration,
        "low_load_requests_per_side": proxy[low].sent,
        "slo_ms": round(slo_s * 1000, 1),
        "unloaded_ttft_p50_direct_ms": round(unloaded_ms, 1),
        "service_rate_rps": round(service, 3),
        "calibration": calibration,
        "rates": [{"rate": r, **{name: _rounded(f[r]) for name, f in figures.items()}} for r in sorted(direct)],
        "goodput_ratio": None if ratio is None else round(ratio, 3),
        "goodput_ratio_rate": rate,
        "ttft_p99_ratio_low_load": None if p99_ratio is None else round(p99_ratio, 3),
        "ttft_p99_ratio_vs_smg_low_load": None if p99_vs_smg is None else round(p99_vs_smg, 3),
        "rates_proxy_goodput_below_smg": below_smg if smg else None,
        "prefix_token_reuse_load": reuse["proxy"],
        "prefix_token_reuse_load_by_side": reuse,
        "prefix_token_reuse_ceiling_load": round(ceiling, 3),
        "reuse_vs_ceiling": round(reuse["proxy"] / ceiling, 3) if ceiling else None,
        **bound.fields(),
        "prompt_cache_ms_total_direct": round(sum(fleet.servers["direct"].prompt_cache_updates_ms())),
        "prompt_cache_ms_total_proxy": round(sum(fleet.servers["proxy"].prompt_cache_updates_ms())),
    }


def _capacity(args: argparse.Namespace, trials: dict[str, dict[float, list[tuple[int, int]]]],
              repeats: int) -> dict[str, object]:
    """Per side, the fitted capacity and its bootstrap interval; the ratios to smg, ContextPilot and direct."""
    sweeps: dict[str, Sweep] = dict(trials)
    fitted = {name: fit_capacity(sweep, args.target) for name, sweep in sweeps.items()}
    samples = bootstrap(sweeps, random.Random(args.seed), args.resamples, args.target)
    per_side: dict[str, dict[str, Any]] = {}
    for name, capacity in fitted.items():
        values = [v for v in samples[name] if v is not None]
        interval = percentile_interval(values) if values else None
        per_side[name] = {"rps": _r(capacity.rps), "censored": capacity.censored,
                          "ci": [_r(v) for v in interval] if interval else None}
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for base in ("smg", "contextpilot", "direct"):
        if base not in sweeps:
            continue
        for name in sweeps:
            if name != base:
                ratio = capacity_ratio(sweeps, name, base, target=args.target, resamples=args.resamples,
                                       seed=args.seed)
                ratios.setdefault(base, {})[name] = {
                    "ratio": _r(ratio.value), "ci": [_r(v) for v in ratio.interval] if ratio.interval else None,
                    "censored": ratio.censored}
    rates = len(next(iter(sweeps.values())))
    print(f"capacity (highest rate with >= {args.target:.0%} within the objective; fitted over {rates} rates x "
          f"{repeats} repeats, 95% bootstrap interval):")
    for name, entry in per_side.items():
        mark = {"above": " (at least: never below the target)", "below": " (at most: below the target at every "
                "rate)"}.get(entry["censored"] or "", "")
        print(f"  {name:<9} {entry['rps']} requests/s {entry['ci']}{mark}")
    for base, by_side in ratios.items():
        print(f"  ratio to {base}: " + "; ".join(
            f"{name} {r['ratio']} {r['ci']}{' (censored: a bound)' if r['censored'] else ''}"
            for name, r in by_side.items()))
    vs_smg = ratios.get("smg", {}).get("proxy", {})
    vs_one: dict[str, Any] = {}
    if "fleet" in sweeps and "serve" in sweeps:
        ratio = capacity_ratio(sweeps, "fleet", "serve", target=args.target, resamples=args.resamples, seed=args.seed)
        vs_one = {"ratio": _r(ratio.value), "ci": [_r(v) for v in ratio.interval] if ratio.interval else None,
                  "censored": ratio.censored}
        print(f"  fleet of {args.proxies} proxies / one proxy (serve): {vs_one['ratio']} {vs_one['ci']}"
              f"{' (censored: a bound)' if ratio.censored else ''}")
    return {
        "capacity_target": args.target,
        "capacity_repeats": repeats,
        "capacity": per_side,
        "capacity_rps": {name: entry["rps"] for name, entry in per_side.items()},
        "capacity_ratio_vs_smg": vs_smg.get("ratio"),
        "capacity_ratio_vs_smg_ci": vs_smg.get("ci"),
        "capacity_ratio_vs_smg_censored": vs_smg.get("censored"),
        "capacity_ratios": ratios,
        **({"proxies": args.proxies, "capacity_ratio_vs_one_proxy": vs_one["ratio"],
            "capacity_ratio_vs_one_proxy_ci": vs_one["ci"],
            "capacity_ratio_vs_one_proxy_censored": vs_one["censored"]} if vs_one else {}),
    }


def _by_side(args: argparse.Namespace, sides: dict[str, Side], summary: dict[str, Any]) -> dict[str, object]:
    """What each side is, its replies other than 200 by status (``-1``: a stream cut short), its reuse against
    the ceiling, and the end-to-end side's headline ratios."""
    statuses = {name: {str(k): v for k, v in sorted(side.statuses.items())}
                for name, side in sides.items() if hasattr(side, "statuses")}
    ceiling = summary["prefix_token_reuse_ceiling_load"]
    reuse = summary["prefix_token_reuse_load_by_side"]
    print("replies other than 200 per side (status: count; 429 is a refusal): "
          + ", ".join(f"{name} {counts or 'none'}" for name, counts in statuses.items()))
    ratios = summary["capacity_ratios"]
    out: dict[str, object] = {
        "workload": args.workload,
        "present": args.present,
        "side_kinds": {name: SIDE_KINDS[name] for name in sides},
        "http_errors_by_side": statuses,
        "reuse_vs_ceiling_by_side": {name: round(r / ceiling, 3) if ceiling else None for name, r in reuse.items()},
    }
    pilot = sides.get("contextpilot")
    if isinstance(pilot, ContextPilotSide):
        out["contextpilot_reorder_ms"] = pilot.reorder_ms
    for base in ("smg", "contextpilot", "direct"):
        entry = ratios.get(base, {}).get("serve")
        if entry:
            out[f"capacity_ratio_serve_vs_{base}"] = entry["ratio"]
            out[f"capacity_ratio_serve_vs_{base}_ci"] = entry["ci"]
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _rounded(figures: RunFigures) -> dict[str, object]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(figures).items()}
