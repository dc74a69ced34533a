"""Chaos: steady load through a ``ragproxy serve`` process while Redis and one LLM replica are killed and restarted.

``python -m loadtest.bench chaos [--quick] [--json] [--credits-fail-open] [--duration S] [--workers N]``

Set-up, all real processes on loopback: a redis-server this run owns (AOF on, ``appendfsync always``, so a killed
and restarted Redis comes back with every acknowledged write: the ledger's durability promise depends on it), two
fake LLM replicas (``python -m upstream_doubles.llm_server``), and ``ragproxy serve`` in front of them with
``redis.url`` set (credits and API keys on Redis), ``auth.mode=keys`` and credits on. One API key with a large
balance is created through the admin API.

Timeline (fractions of the duration): 0.20 SIGKILL Redis, 0.40 restart it; 0.55 SIGKILL replica B, 0.75 restart
it. Replica A is never touched, so every request is *servable* (at least one replica up for the whole request).

Figures (the last line with ``--json`` is one JSON object):

- ``requests``, ``ok``, ``failed`` and ``failures_by_status``, ``failures_by_phase``;
- ``failed_requests_servable``: failed requests while at least one replica was up (goal 0);
- ``credit_mismatches``: (a) 1 if the balance change differs from the sum of the ledger's charges, plus (b) every
  200 answer with no charge in the ledger, plus (c) every charge in the ledger for a request the client did not
  get a 200 for, plus (d) 1 if credit is still held in reservations once the load has stopped (goal 0). Answers and
  charges are matched by the ledger id each answer names (``X-Credits-Request-ID``, the proxy's own id);
- ``unbilled_upstream_calls``: 200 answers that came from an upstream call (``X-Cache-Status`` ``MISS``,
  ``BYPASS`` or ``REFRESH``) with no charge in the ledger (goal 0; with ``--credits-fail-open`` the requests
  served while Redis was down are expected here); The
  books are read once the proxy's settlement journal has drained into Redis (the bench polls
  ``ragproxy_credit_journal_depth`` on the admin ``/metrics`` until it reads 0, for up to 60 s):
  ``journal_left_after_drain`` (what was still waiting; 0 expected) and ``journal_drain_wait_s``;
- ``outage_counters``: requests admitted on the outage allowance or refused, settlements journaled, and replayed
  per outcome the store gave (``late``: admitted during the outage; ``settled``: reserved before it;
  ``duplicate``: Redis had applied it but its answer was lost when it was killed);
- latency p50/p99 of successful requests in the steady phase and under each fault (the baseline is the steady
  phase of the same run).

No timings are asserted; this is a command that prints what happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.harness import free_port, ledger_charges, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
USER, TENANT = "chaos-user", "chaos-tenant"
TOP_UP = 1_000_000  # credits: far more than any run spends


@dataclass
class Outcome:
    started: float
    ended: float
    status: int
    request_id: str
    error: str = ""
    ledger_id: str = ""
    """``X-Credits-Request-ID``: the ledger entry the answer is charged under."""
    cache_status: str = ""


@dataclass
class Downtime:
    """When each dependency was down (monotonic seconds, open interval until restarted)."""

    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def down(self, name: str, at: float) -> None:
        self.spans.setdefault(name, []).append((at, float("inf")))

    def up(self, name: str, at: float) -> None:
        start, _ = self.spans[name][-1]
        self.spans[name][-1] = (start, at)

    def overlaps(self, name: str, start: float, end: float) -> bool:
        return any(s < end and start < e for s, e in self.spans.get(name, []))


class Redis:
    """A redis-server with a fixed directory and AOF, so a restart keeps acknowledged writes."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, timeout=15)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


class Replica:
    """A fake LLM replica as a process on a fixed port (restartable)."""

    def __init__(self, latency_ms: float) -> None:
        self.port = free_port()
        self.latency_ms = latency_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "upstream_doubles.llm_server", "--port", str(self.port),
             "--latency-ms", str(self.latency_ms)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, timeout=15)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def _proxy_env(port: int, admin_port: int, redis: Redis, replicas: list[Replica], data_dir: Path,
               fail_open: bool) -> dict[str, str]:
    return {
        **os.environ,
        "RAGPROXY_SERVER__PORT": str(port), "RAGPROXY_ADMIN__PORT": str(admin_port),
        "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": r.url} for r in replicas]),
        "RAGPROXY_UPSTREAMS__HEALTH_INTERVAL_S": "0.5", "RAGPROXY_UPSTREAMS__BREAKER_OPEN_S": "1",
        "RAGPROXY_UPSTREAMS__CONNECT_TIMEOUT_S": "1", "RAGPROXY_UPSTREAMS__READ_TIMEOUT_S": "10",
        "RAGPROXY_REDIS__URL": redis.url, "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "true",
        "RAGPROXY_CREDITS__FAIL_OPEN": "true" if fail_open else "false",
        "RAGPROXY_DATA_DIR": str(data_dir), "RAGPROXY_LOGGING__LEVEL": "warning",
        "RAGPROXY_LOGGING__FORMAT": "text",
    }


async def _load(url: str, key: str, until: float, workers: int, outcomes: list[Outcome]) -> None:
    headers = {"Authorization": f"Bearer {key}"}

    async def worker(index: int) -> None:
        n = 0
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
            while time.monotonic() < until:
                n += 1
                question = f"question {n % 40}" if n % 3 else f"unique {index}-{n}"
                rid = f"chaos-{index}-{n}"
                started = time.monotonic()
                body = {"model": "fake-model", "max_tokens": 16,
                        "messages": [{"role": "user", "content": question}]}
                try:
                    response = await client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": rid})
                    outcomes.append(Outcome(started, time.monotonic(), response.status_code, rid,
                                            "" if response.status_code == 200 else response.text[:200],
                                            response.headers.get("X-Credits-Request-ID", ""),
                                            response.headers.get("X-Cache-Status", "")))
                except httpx.HTTPError as exc:
                    outcomes.append(Outcome(started, time.monotonic(), 0, rid, exc.__class__.__name__))

    await asyncio.gather(*(worker(i) for i in range(workers)))


async def _chaos(start: float, duration: float, redis: Redis, replica: Replica, downtime: Downtime) -> None:
    steps = [(0.20, "redis", "kill"), (0.40, "redis", "start"), (0.55, "replica-b", "kill"),
             (0.75, "replica-b", "start")]
    for fraction, name, action in steps:
        await asyncio.sleep(max(0.0, start + fraction * duration - time.monotonic()))
        target: Redis | Replica = redis if name == "redis" else replica
        if action == "kill":
            target.kill()
            downtime.down(name, time.monotonic())
        else:
            await asyncio.to_thread(target.start)
            downtime.up(name, time.monotonic())


def _samples(admin: httpx.Client, family: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric family scraped from the admin ``/metrics``."""
    return [(sample.labels, sample.value) for metric in text_string_to_metric_families(admin.get("/metrics").text)
            if metric.name == family for sample in metric.samples if not sample.name.endswith("_created")]


def _journal_depth(admin: httpx.Client) -> int | None:
    """``ragproxy_credit_journal_depth`` (``None`` when the proxy does not export it)."""
    samples = _samples(admin, "ragproxy_credit_journal_depth")
    return int(samples[0][1]) if samples else None


def _outage_counters(admin: httpx.Client) -> dict[str, int]:
    """The proxy's outage counters: admissions on the allowance, settlements journaled and replayed."""
    counters: dict[str, int] = {}
    for family in ("ragproxy_credit_outage_admissions", "ragproxy_credit_journal_settlements"):
        for labels, value in _samples(admin, family):
            counters["_".join(v for v in labels.values() if v)] = int(value)
    return counters


def _wait_for_journal(admin: httpx.Client, timeout_s: float = 60.0) -> tuple[int | None, float]:
    """Wait until the settlements journaled during the outage reached Redis: (what is left, seconds waited)."""
    started = time.monotonic()
    depth = _journal_depth(admin)
    while depth and time.monotonic() - started < timeout_s:
        time.sleep(0.2)
        depth = _journal_depth(admin)
    return depth, round(time.monotonic() - started, 2)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50_ms": None, "p99_ms": None}
    cuts = statistics.quantiles(values, n=100)
    return {"p50_ms": round(cuts[49] * 1000, 2), "p99_ms": round(cuts[98] * 1000, 2)}


def _phase(o: Outcome, downtime: Downtime) -> str:
    for name in ("redis", "replica-b"):
        if downtime.overlaps(name, o.started, o.ended):
            return f"{name}_down"
    return "steady"


def run(duration: float, workers: int, fail_open: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ragproxy-chaos-"))
    redis = Redis(work / "redis")
    redis.directory.mkdir()
    replicas = [Replica(5.0), Replica(5.0)]
    port, admin_port = free_port(), free_port()
    proxy: subprocess.Popen[bytes] | None = None
    try:
        redis.start()
        for replica in replicas:
            replica.start()
        proxy = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve"], cwd=ROOT,
                                 env=_proxy_env(port, admin_port, redis, replicas, work / "data", fail_open),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for_port(port, timeout=30)
        wait_for_port(admin_port, timeout=30)
        with httpx.Client(base_url=f"http://127.0.0.1:{admin_port}", timeout=10) as admin:
            key = admin.post("/admin/keys", json={"user": USER, "tenant": TENANT}).json()["key"]
            admin.post(f"/admin/credits/{USER}", json={"amount": TOP_UP, "tenant": TENANT}).raise_for_status()
            before = admin.get(f"/admin/credits/{USER}").json()
            since = time.time() - 1
            outcomes: list[Outcome] = []
            downtime = Downtime()
            start = time.monotonic()

            async def scenario() -> None:
                await asyncio.gather(_load(f"http://127.0.0.1:{port}", key, start + duration, workers, outcomes),
                                     _chaos(start, duration, redis, replicas[1], downtime))

            asyncio.run(scenario())
            time.sleep(2.0)  # settles run after the last byte
            journal_left, drain_s = _wait_for_journal(admin)
            outage_counters = _outage_counters(admin)
            after = admin.get(f"/admin/credits/{USER}").json()
            charges = ledger_charges(admin, USER, since)
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proxy.kill()
        for replica in replicas:
            replica.kill()
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)
    figures = _figures(outcomes, downtime, before, after, charges, duration, workers, fail_open)
    return {**figures, "journal_left_after_drain": journal_left, "journal_drain_wait_s": drain_s,
            "outage_counters": outage_counters}


def _figures(outcomes: list[Outcome], downtime: Downtime, before: dict[str, Any], after: dict[str, Any],
             charges: list[dict[str, Any]], duration: float, workers: int, fail_open: bool) -> dict[str, Any]:
    failed = [o for o in outcomes if o.status != 200]
    servable = [o for o in failed if not (downtime.overlaps("replica-a", o.started, o.ended)
                                          and downtime.overlaps("replica-b", o.started, o.ended))]
    ok_ids = {o.ledger_id for o in outcomes if o.status == 200}
    charged_ids = {str(c["request_id"]) for c in charges}
    unbilled = [o for o in outcomes if o.status == 200 and o.cache_status in ("MISS", "BYPASS", "REFRESH")
                and o.ledger_id not in charged_ids]
    spent = int(before["available_micro"]) - int(after["available_micro"])
    charged = -sum(int(c["amount"]) for c in charges)
    mismatch_parts = {
        "balance_vs_ledger": int(spent != charged),
        "ok_without_charge": len(ok_ids - charged_ids),
        "charge_without_ok": len(charged_ids - ok_ids),
        "held_after_run": int(int(after["held_micro"]) != 0),
    }
    by_status: dict[str, int] = {}
    by_phase: dict[str, int] = {}
    latency: dict[str, list[float]] = {}
    for o in outcomes:
        phase = _phase(o, downtime)
        if o.status == 200:
            latency.setdefault(phase, []).append(o.ended - o.started)
        else:
            by_status[str(o.status)] = by_status.get(str(o.status), 0) + 1
            by_phase[phase] = by_phase.get(phase, 0) + 1
    steady = _percentiles(latency.get("steady", []))
    phases = {phase: {**_percentiles(values), "ok": len(values)} for phase, values in sorted(latency.items())}
    for figures in phases.values():
        if steady["p50_ms"] and figures["p50_ms"]:
            figures["p50_ratio_to_steady"] = round(figures["p50_ms"] / steady["p50_ms"], 2)
    return {
        "benchmark": "chaos", "duration_s": duration, "workers": workers, "credits_fail_open": fail_open,
        "requests": len(outcomes), "ok": len(outcomes) - len(failed), "failed": len(failed),
        "failed_requests_servable": len(servable), "failures_by_status": by_status, "failures_by_phase": by_phase,
        "failure_samples": sorted({o.error for o in failed})[:5],
        "credit_mismatches": sum(mismatch_parts.values()), "credit_mismatch_parts": mismatch_parts,
        "unbilled_upstream_calls": len(unbilled),
        "spent_micro": spent, "ledger_charged_micro": charged, "ledger_charges": len(charges),
        "latency_by_phase": phases,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 30-second run (under 90 s in all)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (default 30 quick, 120)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent clients")
    parser.add_argument("--credits-fail-open", action="store_true", help="serve unbilled while Redis is down")
    args = parser.parse_args(argv)
    duration = args.duration or (30.0 if args.quick else 120.0)
    result = run(duration, args.workers, args.credits_fail_open)
    for name, value in result.items():
        if not isinstance(value, dict | list):
            print(f"{name:>26}: {value}")
    for name in ("failures_by_status", "failures_by_phase", "credit_mismatch_parts", "outage_counters",
                 "latency_by_phase", "failure_samples"):
        print(f"{name:>26}: {json.dumps(result[name])}")
    if args.json:
        print(json.dumps(result))
    return 0
