"""``python -m loadtest.bench kv [--quick] [--json]``: KV reuse on real llama-server replicas, direct, SGLang's
gateway, ContextPilot and the proxy (a real ``ragproxy serve``, and its KV stages in-process).

The load benchmark (goodput at a TTFT objective under open-loop arrivals) is
:mod:`loadtest.bench.kv_load`; this is the sequential one, whose figures the load benchmark also prints as its
calibration.

Needs ``llama-server`` and a model: runs ``scripts/build_llama_server.sh`` (idempotent; the first build takes
minutes) and ``scripts/make_tiny_gguf.py --shape SHAPE`` when they are missing (override with
``RAGPROXY_LLAMA_SERVER``, ``--model``; ``RAGPROXY_LLAMA_CACHE`` moves the cache folder).

Workload (``--workload``, ``--present``, :mod:`loadtest.bench._kv_workload`): a corpus of documents with
Zipf-distributed popularity; each request has one system prompt, the top-k (3-5) documents in a varying retrieval
order, and a fresh question (``synthetic``), or the top 5 of 40 passages of real prose with a unique question,
streamed (``zipf-rag``); documents structured, pasted as numbered passages or joined by blank lines only. Every side
sends the same requests, one at a time, each to every side in turn (interleaved, so all see the same load on this
shared machine), each side to its own set of 2 fresh llama-server replicas with the same flags (each with
``--slots`` slots; ``--server-arg`` adds flags to every replica of every side). The sides (``--sides``, ``SIDES``):

* direct (``DirectSide``) — what an app does without ragproxy: documents rendered in retrieval order (the
  same byte-stable template as the proxy's, so only order, routing and hints differ), replicas taken in
  round-robin, server defaults;
* proxy (``ProxySide``) — the request carries its documents as ``ragproxy.documents`` and goes through the
  proxy's ``Shape`` (``reuse`` order, or ``shift`` with ``--order shift``) and ``Route`` stages (knowledge tree
  per replica, TTFT router, llama.cpp ``cache_prompt`` hint — these servers keep prompts in host memory, so the
  slot is theirs to pick, see :class:`~proxy.kv.hints.SlotTable` — tree correction from ``timings.cache_n``,
  slots and capacity read from ``/slots``), run in-process as a pipeline whose terminal sends the shaped body to
  the chosen replica (the HTTP front is not involved);
* smg (``Smg``) — the direct side's requests sent to SGLang's model gateway (``smg launch``, policy
  ``cache_aware``: an approximate prefix tree over the request text per worker) in front of its replicas: the
  router a team would otherwise run. Found by ``find_smg`` (``pip install smg``; no dependency of this
  project); when missing the bench says so in one line and runs without it;
* preserve — the proxy with ``routing.order=preserve``: routing, hints and admission, documents in retrieval
  order. Against ``proxy`` it shows what the order adds to the routing;
* serve (``ServeSide``) — the product end to end: a ``ragproxy serve`` process started with the command line of
  the operations guide (:mod:`loadtest.bench._kv_serve`), the requests sent to it over HTTP as an app sends them.
  ``proxy`` and ``preserve`` are then the diagnostic: the same decisions without the server around them;
* fleet (``ServeSide`` over :class:`~loadtest.bench._kv_serve.ServeFleet`; only when asked for) — ``--proxies``
  (3) ``ragproxy serve`` processes in shared mode (a redis-server of the bench's own) in front of one set of
  replicas, request ``i`` to proxy ``i mod N``: what more than one proxy in front of the same fleet does against
  one (``serve``, which it brings along);
* contextpilot (``ContextPilotSide``) — ContextPilot's library mode reorders each request's documents in the
  client, the requests go to the replicas in round-robin (:mod:`loadtest.bench._kv_contextpilot`; skipped, and
  said so, when ``contextpilot`` is not importable).

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

Where the time goes: TTFT is the wall time of a one-token completion (prefill + one decode step). Each reply
carries the server's own ``timings``; ``prefix_token_reuse`` is ``sum(cache_n) / sum(cache_n + prompt_n)``, and
``prefill_share`` is ``sum(prompt_ms) / sum(TTFT)`` — the part of the time to first token spent computing the
prompt. The rest is the server's per-request work outside the prompt's compute (HTTP, chat template,
tokenisation, slot choice, the one decode step) and its host-memory prompt cache (``--cache-ram``): when a slot
is reused by LRU or would lose more than half of its prompt, the server saves the slot's KV to host memory and
restores the stored prompt sharing the longest prefix with the new one, on its main loop, before the prompt's
timer starts. The replicas run at log verbosity 4, which logs each such update's duration; the bench reports
their total per request (``prompt_cache_ms``). On a GPU build without FlashAttention the V cache is transposed and
that copy is one device-host transfer per layer and V row (16 x 512 for the ``1b`` shape), which is what a
~90 ms TTFT with 97% of the prompt cached pointed to (see BENCHMARKS.md).

What reuse can buy: ``prefix_token_reuse_ceiling`` is the token reuse of a perfect prefix cache on the measured
requests (any order the ``reuse`` policy allows; :func:`loadtest.bench._kv_reuse.ceiling_tokens`).
``prefill_bound_time`` (:mod:`loadtest.bench._kv_bound`) is the peer's prefill time over the prefill time of the
same requests with the ceiling's reuse — the peer is smg where it ran, else direct (``prefill_bound_peer``) —
both priced by the proxy's prefill model (fixed + per token + attention over the context) fitted to every side's
``timings`` of the run (``prefill_bound_fit``: rows and coefficients; ``null`` with fewer than 8 rows).
``prefill_bound_tokens`` is the same ratio in tokens computed: reused early tokens are the cheap ones, so it is
the larger of the two where the model has a fixed part or a context term.

The parts, one module each: the workload (:mod:`loadtest.bench._kv_workload`), the llama-server build, model and
processes and SGLang's gateway (:mod:`loadtest.bench._kv_servers`), the sides (:mod:`loadtest.bench._kv_sides`), the
reuse analysis and a phase's figures (:mod:`loadtest.bench._kv_reuse`); this module runs the sequential phases and is
the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loadtest.bench._kv_bound import PrefillBound, peer_side, prefill_bound
from loadtest.bench._kv_rag import chosen_workload
from loadtest.bench._kv_reuse import Phase, ceiling_tokens, prefill_bound_speedup, prefix_reuse_ceiling
from loadtest.bench._kv_servers import Servers, ensure_binaries, exit_on_sigterm
from loadtest.bench._kv_sides import (
    Fleet,
    ProxySide,
    Side,
    add_server_options,
    chosen_sides,
    fixed_cost_ms,
    open_loop_client,
    run_interleaved,
)
from loadtest.goodput import Outcome


@dataclass(slots=True)
class Sequential:
    """What the sequential phases gave, with the replicas' host prompt-cache update times per side."""

    fixed_ms: float
    cold: Phase | None
    steady: Phase
    prompt_cache_ms: dict[str, float]
    """Per side, the mean time per request its replicas spent saving and restoring prompts in host memory
    (verbosity 4)."""
    over_predicted: dict[str, float | None] = field(default_factory=dict)
    """Per proxy side, the share of requests whose predicted reuse exceeded the backend's report."""

    def timing_rows(self) -> list[Outcome]:
        """Every side's outcomes of both phases: the servers' timings a prefill model is fitted to."""
        phases = [self.steady] if self.cold is None else [self.cold, self.steady]
        return [o for phase in phases for got in phase.sides().values() for o in got]


def measured_bound(result: Sequential, ceiling: Sequence[tuple[int, int]], first: int) -> PrefillBound:
    """The prefill bound (:func:`~loadtest.bench._kv_bound.prefill_bound`) of the measured phase, whose requests
    are the workload's from index ``first`` on: smg's (else direct's) requests, the model fitted to every side's
    rows of both phases."""
    sides = result.steady.sides()
    peer = peer_side(sides)
    return prefill_bound(result.timing_rows(), peer, enumerate(sides[peer], start=first), ceiling)


async def sequential(
    servers: Mapping[str, Servers], sides: Mapping[str, Side], warmup: int, measured: int
) -> Sequential:
    """The fixed cost, then ``warmup`` + ``measured`` requests sent one at a time to every side."""
    fixed_ms = await fixed_cost_ms(servers["proxy"].urls[-1])
    for side in sides.values():
        if isinstance(side, ProxySide):
            await side.discover()
    out = await run_interleaved(sides, range(warmup + measured))
    count = max(1, warmup + measured)

    def phase(part: slice) -> Phase:
        return Phase(out["direct"][part], out["proxy"][part],
                     {name: got[part] for name, got in out.items() if name not in ("direct", "proxy")})

    return Sequential(
        fixed_ms,
        phase(slice(0, warmup)) if warmup else None,
        phase(slice(warmup, None)),
        {name: sum(s.prompt_cache_updates_ms()) / count for name, s in servers.items()},
        {name: side.over_predicted_share for name, side in sides.items() if isinstance(side, ProxySide)},
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench kv")
    parser.add_argument("--quick", action="store_true", help="fewer requests and documents")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--requests", type=int, help="measured requests (quick 16, else 40)")
    parser.add_argument("--warmup", type=int, help="requests sent before, not counted (default: --requests)")
    parser.add_argument("--docs", type=int, help="corpus size (synthetic: quick 10, else 24; zipf-rag 40)")
    parser.add_argument("--doc-words", type=int, help="words per document (synthetic 200, zipf-rag 150)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--order", choices=["reuse", "shift"], default="reuse",
                        help="the proxy's order policy (shift: approximate reuse outside the prefix, see "
                             "proxy.kv.order)")
    parser.add_argument("--direct-shift", type=int, default=0, metavar="N",
                        help="the direct side sends n_cache_reuse=N too (a baseline for --order shift)")
    parser.add_argument("--verbose", action="store_true", help="print every request's TTFT and timings")
    add_server_options(parser)
    args = parser.parse_args(argv)
    requests = args.requests or (16 if args.quick else 40)
    warmup = requests if args.warmup is None else args.warmup
    docs = args.docs or (None if args.workload == "zipf-rag" else 10 if args.quick else 24)
    server, model = ensure_binaries(args.shape, args.weight_type, args.model)
    exit_on_sigterm()
    work = chosen_workload(args, docs=docs, requests=warmup + requests)
    started = time.perf_counter()
    names = chosen_sides(args.sides)
    fleet = Fleet(args, server, model, names)

    async def run() -> Sequential:
        async with open_loop_client() as client:
            return await sequential(fleet.servers, fleet.sides(work, client, args.direct_shift), warmup, requests)

    try:
        fleet.wait_ready()
        result = asyncio.run(run())
    finally:
        fleet.stop()
    cold, steady = result.cold, result.steady
    if args.verbose:
        phases = ([("w", cold)] if cold else []) + [(" ", steady)]
        index = itertools.count()
        for mark, phase in phases:
            for d, p in zip(phase.direct, phase.proxy, strict=True):
                print(
                    f" {mark}#{next(index):<3} direct {d.ttft_s * 1000:7.0f} ms (prefill {d.prompt_ms:6.0f}) cached "
                    f"{d.cache_n:5} computed {d.prompt_n:5} | proxy {p.ttft_s * 1000:7.0f} ms (prefill "
                    f"{p.prompt_ms:6.0f}) cached {p.cache_n:5} computed {p.prompt_n:5}"
                )
    bound = measured_bound(result, ceiling_tokens(work), warmup)
    summary: dict[str, object] = {
        "bench": "kv",
        "requests": requests,
        "warmup_requests": warmup,
        "documents": len(work.documents),
        "replicas": args.replicas,
        "slots_per_replica": args.slots,
        "shape": args.model.name if args.model else f"{args.shape}-{args.weight_type}",
        "server_args": args.server_arg,
        "order": args.order,
        "direct_n_cache_reuse": args.direct_shift,
        "mean_prompt_tokens": round(statistics.mean(s.cache_n + s.prompt_n for s in steady.direct)),
        "fixed_cost_ms": round(result.fixed_ms, 1),
        **steady.summary(),
        "prefill_bound_speedup": round(prefill_bound_speedup(steady), 2),
        "prefix_token_reuse_ceiling": round(prefix_reuse_ceiling(work, warmup), 3),
        **bound.fields(),
        "prompt_cache_ms_per_request": round(result.prompt_cache_ms["proxy"], 1),
        "prompt_cache_ms_per_request_direct": round(result.prompt_cache_ms["direct"], 1),
        "sides": names,
        "tree_over_predicted_share": result.over_predicted,
    }
    if cold is not None:
        summary.update({f"{k}_cold" if k.startswith(("ttft_sp", "prefix")) else f"cold_{k}": v
                        for k, v in cold.summary().items()})
    summary["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(
        f"{warmup} warm-up + {requests} measured requests, {summary['documents']} documents, "
        f"{args.replicas} llama-server replicas x {args.slots} slots, ~{summary['mean_prompt_tokens']} prompt tokens, "
        f"fixed cost {summary['fixed_cost_ms']} ms, model {summary['shape']}"
    )
    print_phases(cold, steady)
    print(f"  prefill saved allows a TTFT speedup of {summary['prefill_bound_speedup']} (steady state); host prompt "
          f"cache updates per request: direct {summary['prompt_cache_ms_per_request_direct']} ms, proxy "
          f"{summary['prompt_cache_ms_per_request']} ms")
    print(f"  a perfect prefix cache with the same order rule would reuse {summary['prefix_token_reuse_ceiling']}"
          " of the measured requests' prompt tokens (estimated tokens)")
    print(f"  prefill bound: {bound.describe()}")
    print(f"  requests whose predicted reuse exceeded the backend's report: {result.over_predicted}")
    if args.json:
        print(json.dumps(summary))
    return 0


def print_phases(cold: Phase | None, steady: Phase) -> None:
    for name, phase in (("cold start (warm-up)", cold), ("steady state (measured)", steady)):
        if phase is None:
            continue
        figures = phase.summary()
        print(f"  {name}:")
        print(
            f"    direct: TTFT p50 {figures['ttft_p50_direct_ms']:8.1f} ms   prefix reuse "
            f"{figures['prefix_token_reuse_direct']:.3f}   prefill share {figures['prefill_share_direct']:.2f}"
        )
        print(
            f"    proxy:  TTFT p50 {figures['ttft_p50_proxy_ms']:8.1f} ms   prefix reuse "
            f"{figures['prefix_token_reuse']:.3f}   prefill share {figures['prefill_share']:.2f}"
        )
        for other in phase.others:
            label = f"{other}:"
            print(
                f"    {label:<7} TTFT p50 {figures[f'ttft_p50_{other}_ms']:8.1f} ms   prefix reuse "
                f"{figures[f'prefix_token_reuse_{other}']:.3f}   prefill share {figures[f'prefill_share_{other}']:.2f}"
            )
        print(f"    ttft_speedup (p50 direct / p50 proxy): {figures['ttft_speedup']}"
              + "".join(f"; vs {o} {figures[f'ttft_speedup_vs_{o}']}" for o in phase.others))
