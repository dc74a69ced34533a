"""``python -m loadtest.bench kv [--quick] [--json]``: KV reuse on real llama-server replicas, direct, SGLang's
gateway and the proxy.

The load benchmark (goodput at a TTFT objective under open-loop arrivals) is
:mod:`loadtest.bench.kv_load`; this is the sequential one, whose figures the load benchmark also prints as its
calibration.

Needs ``llama-server`` and a model: runs ``scripts/build_llama_server.sh`` (idempotent; the first build takes
minutes) and ``scripts/make_tiny_gguf.py --shape SHAPE`` when they are missing (override with
``RAGPROXY_LLAMA_SERVER``, ``--model``; ``RAGPROXY_LLAMA_CACHE`` moves the cache folder).

Workload: a corpus of documents with Zipf-distributed popularity; each request has one system prompt, the
top-k (3-5) documents in a varying retrieval order, and a fresh question. Every side sends the same requests,
one at a time, each to every side in turn (interleaved, so all see the same load on this shared machine), each
side to its own set of 2 fresh llama-server replicas with the same flags (each with ``--slots`` slots;
``--server-arg`` adds flags to every replica of every side). The sides (``--sides``, :data:`SIDES`):

* direct (:class:`DirectSide`) — what an app does without ragproxy: documents rendered in retrieval order (the
  same byte-stable template as the proxy's, so only order, routing and hints differ), replicas taken in
  round-robin, server defaults;
* proxy (:class:`ProxySide`) — the request carries its documents as ``ragproxy.documents`` and goes through the
  proxy's ``Shape`` (``reuse`` order, or ``shift`` with ``--order shift``) and ``Route`` stages (knowledge tree
  per replica, TTFT router, llama.cpp ``cache_prompt`` hint — these servers keep prompts in host memory, so the
  slot is theirs to pick, see :class:`~proxy.kv.hints.SlotTable` — tree correction from ``timings.cache_n``,
  slots and capacity read from ``/slots``), run in-process as a pipeline whose terminal sends the shaped body to
  the chosen replica (the HTTP front is not involved);
* smg (:class:`Smg`) — the direct side's requests sent to SGLang's model gateway (``smg launch``, policy
  ``cache_aware``: an approximate prefix tree over the request text per worker) in front of its replicas: the
  router a team would otherwise run. Found by :func:`find_smg` (``pip install smg``; no dependency of this
  project); when missing the bench says so in one line and runs without it;
* preserve — the proxy with ``routing.order=preserve``: routing, hints and admission, documents in retrieval
  order. Against ``proxy`` it shows what the order adds to the routing.

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
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

from loadtest.goodput import ERROR, OK, REJECTED, Outcome
from normalizer.documents import Document, render, render_document
from normalizer.prompt_plan import Segment
from proxy.core.context import Reply, RequestContext
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.hints import SlotTable, reported_prompt_tokens
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillCoefficients, PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request
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
        k = min(rnd.randint(3, 5), docs)  # (a corpus under 5 documents would never fill a top-5)
        chosen: list[int] = []
        while len(chosen) < k:
            pick = rnd.choices(range(docs), weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        rnd.shuffle(chosen)
        reqs.append((chosen, f"Question {i}: " + sentence(10)))
    return Workload(system, corpus, reqs)


def prefix_reuse_ceiling(work: Workload, first: int = 0, chars_per_token: float = 4.0) -> float:
    """Token reuse of a perfect prefix cache on ``work`` over its requests from index ``first`` on
    (:func:`ceiling_tokens`, summed)."""
    counted = ceiling_tokens(work, chars_per_token)[first:]
    total = sum(t for _, t in counted)
    return sum(c for c, _ in counted) / total if total else 0.0


def ceiling_tokens(work: Workload, chars_per_token: float = 4.0) -> list[tuple[int, int]]:
    """``(cached, prompt)`` estimated tokens of every request of ``work`` under a perfect prefix cache.

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
    out: list[tuple[int, int]] = []
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
        out.append((best, system + sum(doc_tokens[d] for d in chosen) + size(question)))
    return out


@dataclass(frozen=True, slots=True)
class Routed:
    """One answered request of a proxy side, in the knowledge tree's estimated tokens: the workload's request
    ``index``, the order it was routed in (``ticket``), its ``replica`` and prefix ``path``, the prompt's
    ``total``, the reuse ``predicted`` (the tree's, or the chosen slot's) and the ``reported`` one."""

    index: int
    ticket: int
    replica: int
    path: tuple[Segment, ...]
    total: int
    predicted: int
    reported: int


def reuse_losses(routed: Sequence[Routed], first: int, ceiling: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Where reuse goes, as shares of the prompt tokens of the answered requests from workload index ``first``
    on: ``ceiling`` (a perfect prefix cache, best order), ``one_cache`` (the longest prefix of the path as the
    proxy sent it among every path it sent before, to any replica), ``same_replica`` (among those sent to the
    same replica), ``predicted`` and ``reported``. The steps between them are the order chosen, the history split
    across replicas, what the servers lost or the tree forgot, and the prediction's error."""
    seen: set[tuple[str, ...]] = set()
    seen_by: dict[int, set[tuple[str, ...]]] = {}
    sums = dict.fromkeys(["ceiling", "one_cache", "same_replica", "predicted", "reported"], 0)
    total = 0

    def longest(path: tuple[Segment, ...], prefixes: set[tuple[str, ...]]) -> int:
        keys = tuple(segment.key for segment in path)
        tokens = 0
        for depth, segment in enumerate(path, 1):
            if keys[:depth] not in prefixes:
                break
            tokens += segment.tokens
        return tokens

    for r in sorted(routed, key=lambda r: r.ticket):
        replica_seen = seen_by.setdefault(r.replica, set())
        if r.index >= first:
            cached, prompt = ceiling[r.index]
            sums["ceiling"] += round(cached * r.total / prompt) if prompt else 0
            sums["one_cache"] += longest(r.path, seen)
            sums["same_replica"] += longest(r.path, replica_seen)
            sums["predicted"] += r.predicted
            sums["reported"] += r.reported
            total += r.total
        keys = tuple(segment.key for segment in r.path)
        prefixes = {keys[:depth] for depth in range(1, len(keys) + 1)}
        seen |= prefixes
        replica_seen |= prefixes
    return {name: round(value / total, 3) if total else 0.0 for name, value in sums.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_path(shape: str, weight_type: str) -> Path:
    """Where the random-weight model of ``shape`` is cached (the ``tiny`` F16 one keeps its historic name)."""
    if shape == "tiny" and weight_type == "f16":
        return Path(os.environ.get("RAGPROXY_TINY_GGUF", CACHE / "tiny-llama.gguf"))
    return CACHE / f"random-llama-{shape}-{weight_type}.gguf"


def ensure_binaries(shape: str = "tiny", weight_type: str = "f16", model: Path | None = None) -> tuple[Path, Path]:
    """``(llama-server, model)``, building or writing whichever is missing."""
    server = Path(os.environ.get("RAGPROXY_LLAMA_SERVER", CACHE / "llama-server"))
    if not server.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], check=True)
    if model is not None:
        return server, model
    model = model_path(shape, weight_type)
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_tiny_gguf.py"), "--out", str(model), "--shape", shape,
             "--type", weight_type, "--vocab", str(CACHE / "vocab" / "ggml-vocab-llama-spm.gguf")],
            check=True,
        )
    return server, model


MODEL_ID = "tiny"
"""The model id every replica serves (``--alias``) and every request names: smg groups its workers by it."""

PROMPT_CACHE_UPDATE = re.compile(rb"prompt cache update took ([0-9.]+) ms")
"""The line llama-server logs (verbosity 4) after each save/restore of its host-memory prompt cache."""

SLOT_SELECTED = re.compile(rb"\| selected slot by (\w+)")
"""A replica's log line for the slot it gave a request (verbosity 4): ``id`` (the request's ``id_slot``), ``LCP``
(similarity) or ``LRU``."""


def wait_until(proc: subprocess.Popen[bytes], ready: Callable[[], bool], deadline: float, what: str,
               logs: Callable[[], str]) -> None:
    """Poll ``ready`` (connection errors count as not yet) until it holds; fail when ``proc`` exits (with ``logs()``)
    or at ``deadline`` (monotonic)."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {logs()}")
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready")
        time.sleep(0.2)


class Servers:
    """Fresh llama-server replicas (started and stopped by this process only), all with the same flags."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        count: int,
        slots: int,
        ctx_per_slot: int,
        threads: int,
        cache_ram_mib: int = 2048,
        extra_args: Sequence[str] = (),
        verbosity: int | None = None,
    ) -> None:
        self.urls: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs = tempfile.TemporaryDirectory(prefix="ragproxy-llama-")
        self.log_paths: list[Path] = []
        for i in range(count):
            port = _free_port()
            path = Path(self._logs.name) / f"server-{i}.log"
            log = open(path, "wb")  # noqa: SIM115
            command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
            command += ["-c", str(ctx_per_slot * slots), "-np", str(slots), "-t", str(threads)]
            command += ["-tb", str(threads), "--poll", "0", "--no-warmup", "-b", "512", "-ub", "512"]
            command += ["--cache-ram", str(cache_ram_mib), "--alias", MODEL_ID]
            if verbosity is not None:
                command += ["-lv", str(verbosity)]
            command += list(extra_args)
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            self._procs.append(proc)
            self.log_paths.append(path)
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        for url, proc in zip(self.urls, self._procs, strict=True):
            wait_until(proc, lambda url=url: httpx.get(url + "/health", timeout=2).status_code == 200, deadline,
                       f"llama-server at {url}", lambda: f"logs in {self._logs.name}")

    def prompt_cache_updates_ms(self) -> list[float]:
        """Durations of every host prompt-cache update the replicas logged so far (needs verbosity 4)."""
        found: list[float] = []
        for path in self.log_paths:
            found += [float(m) for m in PROMPT_CACHE_UPDATE.findall(path.read_bytes())]
        return found

    def slot_choices(self) -> dict[str, int]:
        """How the replicas chose the slot of every request so far (needs verbosity 4): by the request's ``id``
        (pinned), by similarity (``LCP``) or by ``LRU``."""
        counts: dict[str, int] = {}
        for path in self.log_paths:
            for how in SLOT_SELECTED.findall(path.read_bytes()):
                counts[how.decode()] = counts.get(how.decode(), 0) + 1
        return counts

    async def wait_idle(self, client: httpx.AsyncClient, timeout_s: float = 30.0) -> None:
        """Until no slot of any replica is processing (work a client gave up on is cancelled by the server, but
        not at once), so that the next run starts on an idle machine."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls:
            while time.monotonic() < deadline:
                try:
                    slots = (await client.get(url + "/slots", timeout=5)).json()
                    if not any(s.get("is_processing") for s in slots):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._logs.cleanup()


def find_smg() -> Path | None:
    """SGLang's model gateway (``pip install smg``): ``RAGPROXY_SMG``, else ``smg`` on the PATH or beside this
    Python; ``None`` when there is none (it is no dependency of this project)."""
    if os.environ.get("RAGPROXY_SMG"):
        given = Path(os.environ["RAGPROXY_SMG"])
        return given if given.exists() else None
    found = shutil.which("smg")
    if found:
        return Path(found)
    beside = Path(sys.executable).parent / "smg"
    return beside if beside.exists() else None


class Smg:
    """``smg launch`` (started and stopped by this process) in front of ``urls`` with its ``cache_aware`` policy:
    what a team would put in front of its replicas instead of ragproxy."""

    def __init__(self, binary: Path, urls: Sequence[str], policy: str = "cache_aware") -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.NamedTemporaryFile(prefix="ragproxy-smg-", suffix=".log")  # noqa: SIM115
        command = [str(binary), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                   "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
                   "--worker-startup-check-interval", "1", "--log-level", "warn"]
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the gateway lists the replicas' model (it has registered its workers)."""
        def listed() -> bool:
            response = httpx.get(self.url + "/v1/models", timeout=2)
            return response.status_code == 200 and MODEL_ID in response.text

        def tail() -> str:
            self._log.seek(0)
            return self._log.read()[-2000:].decode(errors="replace")

        wait_until(self._proc, listed, time.monotonic() + timeout_s, f"smg at {self.url}", tail)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a CI job stopped) into ``SystemExit``, so that ``finally`` stops the replicas
    instead of leaving them running (holding a GPU's memory for the next run)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


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
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="comma-separated, of: direct (round-robin), smg (SGLang's gateway, cache_aware; skipped, "
                             "and said so, when smg is not installed), proxy (ragproxy), preserve (ragproxy with "
                             "routing.order=preserve); direct and proxy are always run")


SIDES = ("direct", "smg", "proxy", "preserve")
"""The sides a benchmark can run, each on its own fresh replicas with the same flags: round-robin direct, SGLang's
gateway with its cache-aware policy, ragproxy, and ragproxy keeping the documents in retrieval order (routing,
hints and admission without reordering: what order adds over routing is ``proxy`` against ``preserve``)."""


def chosen_sides(spec: str) -> list[str]:
    """The sides of ``--sides``, in :data:`SIDES` order; ``smg`` dropped, in one printed line, when not installed."""
    asked = {name.strip() for name in spec.split(",") if name.strip()} | {"direct", "proxy"}
    unknown = asked - set(SIDES)
    if unknown:
        raise SystemExit(f"unknown sides: {', '.join(sorted(unknown))} (known: {', '.join(SIDES)})")
    if "smg" in asked and find_smg() is None:
        print("smg not found (pip install smg, or RAGPROXY_SMG=PATH): running without the smg side", flush=True)
        asked.discard("smg")
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

    def sides(self, work: Workload, client: httpx.AsyncClient, direct_shift: int = 0) -> dict[str, Side]:
        args = self.args
        sides: dict[str, Side] = {}
        for name, servers in self.servers.items():
            if name == "direct":
                sides[name] = DirectSide(servers.urls, work, client, direct_shift)
            elif name == "smg":
                assert self.gateway is not None
                sides[name] = DirectSide([self.gateway.url], work, client)
            else:
                policy = OrderPolicy(args.order) if name == "proxy" else OrderPolicy.PRESERVE
                sides[name] = ProxySide(servers.urls, work, client, slots=args.slots, ctx_per_slot=args.ctx_per_slot,
                                        policy=policy, prompt_cache=args.cache_ram != 0)
        return sides

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for servers in self.servers.values():
            servers.stop()


def start_servers(args: argparse.Namespace, binary: Path, model: Path) -> Servers:
    return Servers(binary, model, args.replicas, args.slots, args.ctx_per_slot, args.threads, args.cache_ram,
                   args.server_arg, None if args.no_trace else 4)


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": messages, "max_tokens": 1, "temperature": 0}


def _outcome(started: float, status: int, content: bytes) -> Outcome:
    """An answered request's outcome from its reply (the server's ``timings``), or an error."""
    elapsed = time.perf_counter() - started
    if status != 200:
        return Outcome(ERROR, elapsed)
    timings = orjson.loads(content or b"{}").get("timings", {})
    return Outcome(OK, elapsed, int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0)),
                   float(timings.get("prompt_ms", 0.0)))


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


def _client() -> httpx.AsyncClient:
    """A client that never limits concurrency (the load benchmark is open-loop)."""
    return httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


class DirectSide:
    """Requests sent the way an app does without the proxy: retrieval order, replicas in round-robin (with
    ``n_cache_reuse: shift`` when ``shift`` > 0: what that llama.cpp option does without the proxy's order and
    routing)."""

    def __init__(self, urls: list[str], work: Workload, client: httpx.AsyncClient, shift: int = 0) -> None:
        self.urls, self.work, self.client, self.shift = urls, work, client, shift

    async def send(self, index: int) -> Outcome:
        """Request ``index`` of the workload (round-robin by index, which is arrival order)."""
        indices, question = self.work.requests[index]
        body = _body(render(self.work.system, [self.work.documents[j] for j in indices], question))
        if self.shift:
            body["n_cache_reuse"] = self.shift
        started = time.perf_counter()
        response = await self.client.post(self.urls[index % len(self.urls)] + "/v1/chat/completions", json=body)
        return _outcome(started, response.status_code, response.content)


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
        self.pipeline = Pipeline([ReadPrompt(None), shape, Route(self.replicas, self.router)], self._forward)

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
        routed = ctx.routed
        assert routed is not None
        response = await self.client.post(
            self.urls[routed.replica] + "/v1/chat/completions",
            content=ctx.outgoing_body(),
            headers={"Content-Type": "application/json", **(routed.headers or {})},
        )
        return Reply(response.status_code, body=response.content)

    async def send(self, index: int) -> Outcome:
        """Request ``index`` of the workload; a 429 of the proxy is :data:`~loadtest.goodput.REJECTED`."""
        indices, question = self.work.requests[index]
        body = _body([{"role": "system", "content": self.work.system}, {"role": "user", "content": question}])
        documents = [{"id": d.id, "text": d.text, "title": d.title} for d in (self.work.documents[j] for j in indices)]
        ctx = RequestContext(
            request=Request("POST", "/v1/chat/completions"),
            route="chat",
            request_id=f"kv-{index}",
            raw_body=orjson.dumps(body),
            body=body,
            proxy_fields={"ragproxy": {"documents": documents}},
        )
        started = time.perf_counter()
        try:
            reply = await self.pipeline(ctx)
        except ProxyError as error:
            if error.status == 429:
                return Outcome(REJECTED, time.perf_counter() - started)
            raise
        outcome = _outcome(started, reply.status, reply.body or b"")
        if ctx.routed is not None and outcome.status == OK:
            self.estimates.append((ctx.routed.estimated_ttft_s, outcome.ttft_s))
            self._check_prediction(ctx, reply.body or b"")
        return outcome

    def _check_prediction(self, ctx: RequestContext, body: bytes) -> None:
        """Count whether the expectation as the request started, and the tree's prediction it was routed on, exceeded
        what the backend reported it reused (the tree counts estimated tokens: the report is scaled by the prompt's
        estimated / reported length)."""
        routed, cached = ctx.routed, ctx.reported_cached_tokens
        if routed is None or cached is None:
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


def _reuse(samples: list[Outcome]) -> float:
    cached = sum(s.cache_n for s in samples)
    total = cached + sum(s.prompt_n for s in samples)
    return cached / total if total else 0.0


def _prefill_share(samples: list[Outcome]) -> float:
    total_ms = sum(s.ttft_s for s in samples) * 1000
    return sum(s.prompt_ms for s in samples) / total_ms if total_ms else 0.0


@dataclass(slots=True)
class Phase:
    direct: list[Outcome]
    proxy: list[Outcome]
    others: dict[str, list[Outcome]] = field(default_factory=dict)
    """The further sides (``smg``, ``preserve``), by name."""

    def summary(self) -> dict[str, float]:
        p50_direct = statistics.median(s.ttft_s for s in self.direct) * 1000
        p50_proxy = statistics.median(s.ttft_s for s in self.proxy) * 1000
        figures = {
            "ttft_p50_direct_ms": round(p50_direct, 1),
            "ttft_p50_proxy_ms": round(p50_proxy, 1),
            "ttft_mean_direct_ms": round(statistics.mean(s.ttft_s for s in self.direct) * 1000, 1),
            "ttft_mean_proxy_ms": round(statistics.mean(s.ttft_s for s in self.proxy) * 1000, 1),
            "ttft_speedup": round(p50_direct / p50_proxy, 2),
            "prefix_token_reuse": round(_reuse(self.proxy), 3),
            "prefix_token_reuse_direct": round(_reuse(self.direct), 3),
            "prefill_share": round(_prefill_share(self.proxy), 3),
            "prefill_share_direct": round(_prefill_share(self.direct), 3),
            "prompt_ms_mean": round(statistics.mean(s.prompt_ms for s in self.proxy), 1),
            "prompt_ms_mean_direct": round(statistics.mean(s.prompt_ms for s in self.direct), 1),
        }
        for name, samples in self.others.items():
            p50 = statistics.median(s.ttft_s for s in samples) * 1000
            figures[f"ttft_p50_{name}_ms"] = round(p50, 1)
            figures[f"ttft_speedup_vs_{name}"] = round(p50 / p50_proxy, 2)
            figures[f"prefix_token_reuse_{name}"] = round(_reuse(samples), 3)
            figures[f"prefill_share_{name}"] = round(_prefill_share(samples), 3)
        return figures


def prefill_bound_speedup(phase: Phase) -> float:
    """The TTFT speedup the proxy's saved prefill allows: mean direct TTFT over (mean direct TTFT minus the prefill
    time the proxy saved per request) — what a perfect proxy that only cut prefill could give on this phase."""
    direct_ttft = statistics.mean(s.ttft_s for s in phase.direct) * 1000
    saved = statistics.mean(s.prompt_ms for s in phase.direct) - statistics.mean(s.prompt_ms for s in phase.proxy)
    return direct_ttft / (direct_ttft - saved) if direct_ttft > saved else math.inf


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
    parser.add_argument("--docs", type=int)
    parser.add_argument("--doc-words", type=int, default=200)
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
    docs = args.docs or (10 if args.quick else 24)
    server, model = ensure_binaries(args.shape, args.weight_type, args.model)
    exit_on_sigterm()
    work = make_workload(docs=docs, requests=warmup + requests, doc_words=args.doc_words, seed=args.seed)
    started = time.perf_counter()
    names = chosen_sides(args.sides)
    fleet = Fleet(args, server, model, names)

    async def run() -> Sequential:
        async with _client() as client:
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
    summary: dict[str, object] = {
        "bench": "kv",
        "requests": requests,
        "warmup_requests": warmup,
        "documents": docs,
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
        f"{warmup} warm-up + {requests} measured requests, {docs} documents, {args.replicas} llama-server "
        f"replicas x {args.slots} slots, ~{summary['mean_prompt_tokens']} prompt tokens, "
        f"fixed cost {summary['fixed_cost_ms']} ms, model {summary['shape']}"
    )
    print_phases(cold, steady)
    print(f"  prefill saved allows a TTFT speedup of {summary['prefill_bound_speedup']} (steady state); host prompt "
          f"cache updates per request: direct {summary['prompt_cache_ms_per_request_direct']} ms, proxy "
          f"{summary['prompt_cache_ms_per_request']} ms")
    print(f"  a perfect prefix cache with the same order rule would reuse {summary['prefix_token_reuse_ceiling']}"
          " of the measured requests' prompt tokens (estimated tokens)")
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
