"""The sides of the kv benchmarks, each on its own replicas with the same flags: direct (round-robin), smg
(SGLang's gateway), serve (a real ``ragproxy serve`` over HTTP, :mod:`loadtest.bench._kv_serve`: the product as
users run it), fleet (``--proxies`` of them in shared mode in front of the same replicas), proxy and preserve (the
proxy's KV layer in-process, a diagnostic; see :mod:`loadtest.bench.kv`)."""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import httpx
import orjson

from loadtest.bench._kv_contextpilot import ContextPilotSide, contextpilot_installed
from loadtest.bench._kv_requests import chat_body, outcome_of, post_chat, refusal
from loadtest.bench._kv_reuse import Routed
from loadtest.bench._kv_serve import Serve, ServeFleet
from loadtest.bench._kv_servers import Servers, Smg, find_smg
from loadtest.bench._kv_workload import PRESENTS, Workload, app_messages, structured_parts
from loadtest.goodput import OK, Outcome
from normalizer.documents import DocumentRegistry
from normalizer.repeated_blocks import DEFAULT_MAX_BYTES as REPEATED_BYTES
from normalizer.repeated_blocks import RepeatedBlocks
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.handoffs import RoutedRequest
from proxy.kv.hints import SlotTable, reported_prompt_tokens
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request
from proxy.upstream.client import UpstreamClient
from proxy.upstream.forward import DESTINATION


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """The replica and model options the sequential and load benchmarks share (both sides get the same)."""
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--ctx-per-slot", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads per replica")
    parser.add_argument("--cache-ram", type=int, default=2048, metavar="MIB",
                        help="llama-server's host-memory prompt cache (0: none; the proxy then pins slots)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="an extra llama-server argument for every replica of both sides (repeatable; "
                             "e.g. --server-arg=-ngl --server-arg=99)")
    parser.add_argument("--shape", default="tiny", help="model shape of scripts/make_tiny_gguf.py: tiny, 1b, 8b")
    parser.add_argument("--type", dest="weight_type", choices=["f16", "q8_0"], default="f16")
    parser.add_argument("--model", type=Path, help="a GGUF model to use instead of the shape's random one")
    parser.add_argument("--no-trace", action="store_true",
                        help="run the replicas at the default log verbosity (no prompt-cache update times)")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help="comma-separated, of: direct (round-robin), smg (SGLang's gateway, cache_aware), "
                             "contextpilot (ContextPilot's library mode in the client, the replicas in round-robin), "
                             "serve (a real ragproxy serve over HTTP, end to end), fleet (--proxies ragproxy serve "
                             "processes in shared mode, one Redis, in front of the same replicas, clients dealt "
                             "round-robin over them; not in the default), proxy (ragproxy's KV stages in "
                             "this process: a diagnostic), preserve (the same with routing.order=preserve); smg and "
                             "contextpilot are skipped, and said so, when not installed; direct and proxy always run")
    parser.add_argument("--serve-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the serve and fleet sides' ragproxy serve (repeatable; after the bench's "
                             "own: routing.order from --order, cache.enabled=false, and the fleet's redis.url)")
    parser.add_argument("--proxies", type=int, default=3,
                        help="the fleet side's ragproxy serve processes in front of its replicas")
    parser.add_argument("--workload", choices=["synthetic", "zipf-rag"], default="synthetic",
                        help="synthetic: syllable documents, top-k 3-5 in shuffled order; zipf-rag: 40 stdlib "
                             "docstring passages of ~150 words, the top 5 of a Zipf(1.1) popularity in the order "
                             "drawn, unique questions, streamed (loadtest.bench._kv_rag)")
    parser.add_argument("--present", choices=PRESENTS, default="structured",
                        help="how the documents are sent: structured (ragproxy.documents to the proxy's sides), "
                             "pasted as numbered passages in the user message, or joined by blank lines only there "
                             "(both: the same prompt to every side)")
    parser.add_argument("--questions", type=Path,
                        help="zipf-rag: a JSON-lines file whose 'question' fields are the questions (default: "
                             "questions made from other docstring passages)")


SIDES = ("direct", "smg", "contextpilot", "serve", "fleet", "proxy", "preserve")
"""The sides a benchmark can run, each on its own fresh replicas with the same flags: round-robin direct, SGLang's
gateway with its cache-aware policy, ContextPilot's library mode in the client in front of the replicas in
round-robin (:mod:`loadtest.bench._kv_contextpilot`), a real ``ragproxy serve`` (end to end, over HTTP), and
ragproxy's KV stages in-process, reordering and keeping the documents in retrieval order (routing, hints and
admission without reordering: what order adds over routing is ``proxy`` against ``preserve``). The in-process
sides are a diagnostic: they show what the KV layer decides without the server around it. The fleet side is
``--proxies`` real ``ragproxy serve`` processes in shared mode in front of one set of replicas
(:class:`~loadtest.bench._kv_serve.ServeFleet`): what more than one proxy in front of the same fleet costs or
gains against one (``serve``)."""

DEFAULT_SIDES = tuple(name for name in SIDES if name != "fleet")
"""``--sides`` when not given: the fleet side starts several proxies and a Redis, so it runs when asked for."""

SIDE_KINDS = {
    "direct": "the replicas in round-robin, no proxy",
    "smg": "SGLang's gateway (cache_aware) over HTTP",
    "contextpilot": "ContextPilot's library mode in the client, the replicas in round-robin",
    "serve": "end to end: a ragproxy serve process over HTTP",
    "fleet": "end to end: several ragproxy serve processes in shared mode (one Redis) in front of the same "
             "replicas, clients round-robin over them",
    "proxy": "diagnostic: ragproxy's Shape and Route stages in the bench's process",
    "preserve": "diagnostic: the in-process stages with routing.order=preserve",
}
"""What each side is, for the JSON."""


def chosen_sides(spec: str) -> list[str]:
    """The sides of ``--sides``, in :data:`SIDES` order; ``smg`` dropped, in one printed line, when not installed;
    ``fleet`` brings ``serve``, the one proxy it is compared with, and is dropped the same way without redis-server."""
    asked = {name.strip() for name in spec.split(",") if name.strip()} | {"direct", "proxy"}
    if "fleet" in asked and shutil.which("redis-server") is None:
        print("redis-server not found on the PATH: running without the fleet side", flush=True)
        asked.discard("fleet")
    if "fleet" in asked:
        asked.add("serve")
    unknown = asked - set(SIDES)
    if unknown:
        raise SystemExit(f"unknown sides: {', '.join(sorted(unknown))} (known: {', '.join(SIDES)})")
    if "smg" in asked and find_smg() is None:
        print("smg not found (pip install smg, or RAGPROXY_SMG=PATH): running without the smg side", flush=True)
        asked.discard("smg")
    if "contextpilot" in asked and not contextpilot_installed():
        print("contextpilot not importable (pip install contextpilot): running without the contextpilot side",
              flush=True)
        asked.discard("contextpilot")
    return [name for name in SIDES if name in asked]


class Side(Protocol):
    work: Workload

    async def send(self, index: int) -> Outcome: ...


class Fleet:
    """Fresh replicas per side (started and stopped by this process), and smg in front of its own."""

    def __init__(self, args: argparse.Namespace, binary: Path, model: Path, names: Sequence[str]) -> None:
        self.args = args
        self.servers: dict[str, Servers] = {}
        self.gateway: Smg | None = None
        self.serve: Serve | None = None
        self.fleet: ServeFleet | None = None
        for name in names:
            self.servers[name] = start_servers(args, binary, model)

    def wait_ready(self) -> None:
        for servers in self.servers.values():
            servers.wait_ready(300)
        if "smg" in self.servers:
            smg = find_smg()
            assert smg is not None
            self.gateway = Smg(smg, self.servers["smg"].urls)
            self.gateway.wait_ready()
        slo_ms = getattr(self.args, "slo_ms", None)
        proxy_options = {"slots": self.args.slots, "order": self.args.order,
                         "slo_s": slo_ms / 1000 if slo_ms else None, "settings": self.args.serve_set}
        if "serve" in self.servers:
            self.serve = Serve(self.servers["serve"].urls, **proxy_options)
            self.serve.wait_ready()
            print("serve side: " + " ".join(self.serve.command[1:]), flush=True)
        if "fleet" in self.servers:
            self.fleet = ServeFleet(self.servers["fleet"].urls, count=self.args.proxies, **proxy_options)
            self.fleet.wait_ready()
            print(f"fleet side: {self.args.proxies} x " + " ".join(self.fleet.proxies[0].command[1:]), flush=True)

    def sides(self, work: Workload, client: httpx.AsyncClient, direct_shift: int = 0) -> dict[str, Side]:
        args = self.args
        sides: dict[str, Side] = {}
        for name, servers in self.servers.items():
            if name == "direct":
                sides[name] = DirectSide(servers.urls, work, client, direct_shift)
            elif name == "smg":
                assert self.gateway is not None
                sides[name] = DirectSide([self.gateway.url], work, client)
            elif name == "contextpilot":
                sides[name] = ContextPilotSide(servers.urls, work, client)
            elif name == "serve":
                assert self.serve is not None
                sides[name] = ServeSide([self.serve.url], work, client)
            elif name == "fleet":
                assert self.fleet is not None
                sides[name] = ServeSide(self.fleet.urls, work, client)
            else:
                policy = OrderPolicy(args.order) if name == "proxy" else OrderPolicy.PRESERVE
                sides[name] = ProxySide(servers.urls, work, client, slots=args.slots, ctx_per_slot=args.ctx_per_slot,
                                        policy=policy, prompt_cache=args.cache_ram != 0)
        return sides

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.serve is not None:
            self.serve.stop()
        if self.fleet is not None:
            self.fleet.stop()
        for servers in self.servers.values():
            servers.stop()


def start_servers(args: argparse.Namespace, binary: Path, model: Path) -> Servers:
    return Servers(binary, model, args.replicas, args.slots, args.ctx_per_slot, args.threads, args.cache_ram,
                   args.server_arg, None if args.no_trace else 4)


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


def open_loop_client() -> httpx.AsyncClient:
    """A client that never limits concurrency (the load benchmark is open-loop)."""
    return httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


class DirectSide:
    """Requests sent the way an app does without the proxy: retrieval order, replicas in round-robin (with
    ``n_cache_reuse: shift`` when ``shift`` > 0: what that llama.cpp option does without the proxy's order and
    routing)."""

    def __init__(self, urls: list[str], work: Workload, client: httpx.AsyncClient, shift: int = 0) -> None:
        self.urls, self.work, self.client, self.shift = urls, work, client, shift
        self.statuses: Counter[int] = Counter()
        """Replies other than 200, by status."""

    async def send(self, index: int) -> Outcome:
        """Request ``index`` of the workload (round-robin by index, which is arrival order)."""
        body = chat_body(app_messages(self.work, index), self.work.stream)
        if self.shift:
            body["n_cache_reuse"] = self.shift
        return await post_chat(self.client, self.urls[index % len(self.urls)] + "/v1/chat/completions", body,
                               self.statuses)


class ServeSide:
    """Requests to ``ragproxy serve`` processes over HTTP, as an app sends them: pasted documents in the prompt, or
    structured ones in ``ragproxy.documents``; its 429 is a refusal. With more than one proxy (the ``fleet``
    side), request ``i`` goes to proxy ``i mod N``: clients dealt round-robin over the proxies."""

    def __init__(self, urls: Sequence[str], work: Workload, client: httpx.AsyncClient) -> None:
        if not urls:
            raise ValueError("no proxy to send to")
        self.urls, self.work, self.client = list(urls), work, client
        self.statuses: Counter[int] = Counter()
        """Replies other than 200, by status (502s among them)."""

    async def send(self, index: int) -> Outcome:
        if self.work.in_prompt:
            body = chat_body(app_messages(self.work, index), self.work.stream)
        else:
            messages, documents = structured_parts(self.work, index)
            body = {**chat_body(messages, self.work.stream), "ragproxy": {"documents": documents}}
        url = self.urls[index % len(self.urls)]
        return await post_chat(self.client, url + "/v1/chat/completions", body, self.statuses)


class ProxySide:
    """Requests through the proxy's KV layer: Shape and Route, run in-process, in front of the replicas.

    One instance lives as long as its replicas (knowledge trees, prefill models, router and queues carry over from
    one request, and one run, to the next, as in a proxy that keeps running). With ``slo_s`` the router refuses
    (429) what no replica can answer within it and the admission queue drops what can no longer start in time.
    """

    def __init__(
        self,
        urls: list[str],
        work: Workload,
        client: httpx.AsyncClient,
        *,
        slots: int,
        ctx_per_slot: int,
        policy: OrderPolicy = OrderPolicy.REUSE,
        slo_s: float | None = None,
        prompt_cache: bool = True,
    ) -> None:
        self.urls, self.work, self.client = urls, work, client
        self.estimates: list[tuple[float, float]] = []
        """``(estimated, measured)`` TTFT of every answered request, in seconds."""
        self.routed: list[Routed] = []
        """Every answered request, for :func:`reuse_losses`."""
        self.checked = 0
        self.over_predicted = 0
        self.over_predicted_at_route = 0
        """Answered requests whose reuse the backend reported, and those for which the expectation as the request
        started (the chosen slot's prefix, or the tree's match then) and the tree's prediction at routing time
        were more cached tokens than it reported, beyond the tree's tolerance."""
        models = [PrefillModel(PrefillCoefficients(0.02, 0.0006, 0.0), min_observations=4) for _ in urls]
        self.router = Router(models, ttft_slo_s=slo_s)
        self.replicas = [
            Replica(
                index=i,
                kind=LLAMACPP,
                tree=KnowledgeTree(slots * ctx_per_slot * 8, prefill=models[i]),
                prefill=models[i],
                queue=AdmissionQueue(limit=slots, backlog=self.router.loads[i].running_s),
                slots=SlotTable(slots, prompt_cache=prompt_cache, cache_tokens=slots * ctx_per_slot * 8),
            )
            for i in range(len(urls))
        ]
        shape = Shape(self.replicas, default_policy=policy)
        # a registry and a learner of moving paragraphs, as the product has with routing on: without the registry,
        # pasted passages are not recognised, without the learner, joined ones
        read = ReadPrompt(DocumentRegistry(), repeated=RepeatedBlocks(REPEATED_BYTES))
        self.pipeline = Pipeline([read, shape, Route(self.replicas, self.router)], self._forward)

    def set_objective(self, slo_s: float) -> None:
        """From now on, refuse (429) what no replica can answer within ``slo_s`` seconds."""
        self.router.ttft_slo_s = slo_s
        self.router.tracks_load = True

    async def discover(self) -> None:
        """Read every replica's ``/slots`` (the real slot count and KV size), as the proxy does."""
        client = UpstreamClient(connect_timeout=5, read_timeout=10, pool_size=1)
        try:
            for replica, url in zip(self.replicas, self.urls, strict=True):
                answer = await read_slots(client, url, {})
                if answer is not None:
                    apply_slots(answer, tree=replica.tree, queue=replica.queue, slot_table=replica.slots)
        finally:
            await client.close()

    async def _forward(self, ctx: RequestContext) -> Reply:
        routed = ctx.handoffs.get(DESTINATION)
        assert routed is not None
        response = await self.client.post(
            self.urls[routed.replica] + "/v1/chat/completions",
            content=ctx.outgoing_body(),
            headers={"Content-Type": "application/json", **(routed.headers or {})},
        )
        return Reply(response.status_code, body=response.content)

    async def send(self, index: int) -> Outcome:
        """Request ``index`` of the workload; a 429 of the proxy is :data:`~loadtest.goodput.REJECTED`
        (:func:`~loadtest.bench._kv_requests.refusal`). Never streamed (a one-token answer: its TTFT is its
        latency), so that the stages read the server's report."""
        if self.work.in_prompt:
            body, fields = chat_body(app_messages(self.work, index)), {}
        else:
            messages, documents = structured_parts(self.work, index)
            body, fields = chat_body(messages), {"ragproxy": {"documents": documents}}
        ctx = RequestContext(
            request=Request("POST", "/v1/chat/completions"),
            route="chat",
            request_id=f"kv-{index}",
            raw_body=orjson.dumps(body),
            body=body,
            proxy_fields=fields,
        )
        started = time.perf_counter()
        try:
            reply = await self.pipeline(ctx)
        except ProxyError as error:
            if error.status == 429:
                return refusal(started, error.code)
            raise
        outcome = outcome_of(started, reply.status, reply.body or b"")
        routed = ctx.handoffs.get(DESTINATION)
        if isinstance(routed, RoutedRequest) and outcome.status == OK:
            self.estimates.append((routed.estimated_ttft_s, outcome.ttft_s))
            self._check_prediction(ctx, reply.body or b"")
        return outcome

    def _check_prediction(self, ctx: RequestContext, body: bytes) -> None:
        """Count whether the expectation as the request started, and the tree's prediction it was routed on, exceeded
        what the backend reported it reused (the tree counts estimated tokens: the report is scaled by the prompt's
        estimated / reported length)."""
        routed, cached = ctx.handoffs.get(DESTINATION), ctx.reported_cached_tokens
        if not isinstance(routed, RoutedRequest) or cached is None:
            return
        prompt = reported_prompt_tokens(body)
        scale = routed.total_tokens / prompt if prompt and routed.total_tokens else 1.0
        expected = routed.expected if routed.expected is not None else routed.predicted
        self.checked += 1
        tolerance = self.replicas[routed.replica].tree.tolerance_tokens
        self.over_predicted += expected.tokens > round(cached * scale) + tolerance
        self.over_predicted_at_route += routed.predicted.tokens > round(cached * scale) + tolerance
        self.routed.append(Routed(int(ctx.request_id.removeprefix("kv-")), int(routed.ticket), routed.replica,
                                  tuple(routed.path), routed.total_tokens, expected.tokens,
                                  min(routed.total_tokens, round(cached * scale))))

    @property
    def over_predicted_share(self) -> float | None:
        return round(self.over_predicted / self.checked, 3) if self.checked else None

    @property
    def over_predicted_at_route_share(self) -> float | None:
        return round(self.over_predicted_at_route / self.checked, 3) if self.checked else None


async def run_interleaved(sides: Mapping[str, Side], indices: Sequence[int]) -> dict[str, list[Outcome]]:
    """Each request goes to every side in turn, one at a time: all see the same (noisy, shared) machine."""
    out: dict[str, list[Outcome]] = {name: [] for name in sides}
    for index in indices:
        for name, side in sides.items():
            out[name].append(await side.send(index))
        failed = {name: got[-1] for name, got in out.items() if got[-1].status != OK}
        if failed:
            raise RuntimeError(f"request {index} failed: {failed}")
    return out
