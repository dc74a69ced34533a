"""``python -m loadtest.run_locust --duration 20 [--json]``: the Locust RAG scenario against ragproxy and test doubles.

Starts, each on a free 127.0.0.1 port: the fake LLM with a KV-cache model (``upstream_doubles.llm_server``), the
TEST-ONLY Qdrant REST shim (``upstream_doubles.qdrant_shim``) seeded with a collection of passages (payload ``text``)
about the first ``--topics`` NQ-open questions, and ``ragproxy serve`` pointed at both. Then runs
``loadtest/locustfile.py`` headless for ``--duration`` seconds against the proxy, stops everything, and prints
requests/s, p50/p95/p99 per request kind, the hit ratio per tier and the errors; ``--json`` adds the summary as
one JSON line at the end. Exit code 0 when the run had no failures, 1 otherwise.

Passage vectors are the fake LLM's deterministic embeddings (:func:`upstream_doubles.openai_shapes.embedding_vector`)
of each topic's question, nudged per passage, so a search with the usual phrasing of a question finds that
topic's passages. Everything runs on loopback and stops by itself: Locust gets ``-t``, and the runner kills it
``--duration`` + 90 s after start at the latest. The doubles ship with ragproxy (``upstream_doubles``), so it also runs
from an installed wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import free_port, wait_for_port
from loadtest.rag_users import hit_ratios, load_topics, passages_for

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
EMBEDDING_DIM = 32


def clean_environ() -> dict[str, str]:
    """This process's environment without RAGPROXY_* (the caller's settings must not leak into the run)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("RAGPROXY_")}


@contextmanager
def service(name: str, args: list[str], logs: Path, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> Iterator[subprocess.Popen[bytes]]:
    """A Python child process, its output in ``logs/name.log``; terminated (then killed) on exit."""
    with (logs / f"{name}.log").open("wb") as output:
        process = subprocess.Popen([sys.executable, *args], cwd=cwd, env={**clean_environ(), **(env or {})},
                                   stdout=output, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def seed_collection(qdrant_url: str, collection: str, topics: int, per_topic: int) -> int:
    """Create ``collection`` and upsert the passages; returns how many."""
    from qdrant_client import QdrantClient, models

    from upstream_doubles.openai_shapes import embedding_vector

    client = QdrantClient(url=qdrant_url, timeout=30)
    client.create_collection(collection, vectors_config=models.VectorParams(size=EMBEDDING_DIM,
                                                                            distance=models.Distance.COSINE))
    points = []
    for index, topic in enumerate(load_topics(topics)):
        anchor = np.asarray(embedding_vector(topic.question, EMBEDDING_DIM), dtype=np.float64)
        for part, text in enumerate(passages_for(topic, per_topic)):
            nudge = np.asarray(embedding_vector(text, EMBEDDING_DIM), dtype=np.float64)
            vector = anchor + 0.1 * nudge
            points.append(models.PointStruct(
                id=index * per_topic + part, vector=(vector / np.linalg.norm(vector)).tolist(),
                payload={"text": text, "topic": index, "doc_id": f"topic{index}-part{part}"}))
    client.upsert(collection, points=points, wait=True)
    client.close()
    return len(points)


def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/readyz did not answer 200 within {timeout}s")
        time.sleep(0.2)


def admin_call(admin_url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One JSON call to the proxy's admin API (loopback: no token needed)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(admin_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def provision_keys(admin_url: str, tenants: int, keys_per_tenant: int, credits: str) -> list[dict[str, str]]:
    """Create an API key per (tenant, user) through the admin API and top each user up with ``credits``."""
    issued = []
    for tenant_number in range(1, tenants + 1):
        tenant = f"tenant-{tenant_number}"
        for user_number in range(1, keys_per_tenant + 1):
            user = f"{tenant}-user-{user_number}"
            created = admin_call(admin_url, "POST", "/admin/keys", {"user": user, "tenant": tenant, "name": "load"})
            admin_call(admin_url, "POST", f"/admin/credits/{user}", {"amount": credits, "tenant": tenant})
            issued.append({"tenant": tenant, "api_key": str(created["key"])})
    return issued


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process in MiB (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def scrape_metrics(admin_url: str) -> str:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Start the doubles and the proxy, run Locust, return its report with the hit ratios added."""
    llm_port, qdrant_port, proxy_port, admin_port = (free_port() for _ in range(4))
    llm_args = ["-m", "upstream_doubles.llm_server", "--port", str(llm_port), "--kv-blocks", str(args.kv_blocks),
                "--slots", str(args.slots), "--embedding-dim", str(EMBEDDING_DIM),
                "--latency-ms", str(args.llm_latency_ms), "--chunk-latency-ms", str(args.chunk_latency_ms)]
    proxy_env = {
        "RAGPROXY_SERVER__HOST": "127.0.0.1", "RAGPROXY_SERVER__PORT": str(proxy_port),
        "RAGPROXY_ADMIN__HOST": "127.0.0.1", "RAGPROXY_ADMIN__PORT": str(admin_port),
        "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": f"http://127.0.0.1:{llm_port}", "kind": "llamacpp"}]),
        "RAGPROXY_UPSTREAMS__QDRANT__URL": f"http://127.0.0.1:{qdrant_port}",
        # the passages are seeded directly in Qdrant, as an ingestion job would: every tenant is granted reading them
        "RAGPROXY_UPSTREAMS__QDRANT__COLLECTIONS": json.dumps({args.collection: {"read": ["*"]}}),
        "RAGPROXY_DATA_DIR": str(logs / "data"), "RAGPROXY_LOGGING__LEVEL": "warning",
    }
    if args.credits:
        proxy_env.update({"RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "true"})
    proxy_env.update(dict(setting.split("=", 1) for setting in args.proxy_env))
    report_path = logs / "locust-report.json"
    with ExitStack() as stack:
        # The three start side by side (start-up dominates a short run); the proxy needs neither to start.
        stack.enter_context(service("llm", llm_args, logs))
        stack.enter_context(service("qdrant", ["-m", "upstream_doubles.qdrant_shim", "--port", str(qdrant_port)], logs))
        proxy = stack.enter_context(service("proxy", ["-m", "commands.cli", "serve"], logs, proxy_env, cwd=logs))
        for port in (llm_port, qdrant_port, proxy_port):
            wait_for_port(port, timeout=60)
        passages = seed_collection(f"http://127.0.0.1:{qdrant_port}", args.collection, args.topics,
                                   args.passages_per_topic)
        proxy_url, admin_url = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}"
        wait_ready(proxy_url)
        keys_option: list[str] = []
        if args.credits:
            keys_file = logs / "api-keys.json"
            keys_file.write_text(json.dumps(provision_keys(admin_url, args.tenants, args.keys_per_tenant,
                                                           args.credits_per_user)), encoding="utf-8")
            keys_option = ["--rag-keys-file", str(keys_file)]
        command = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "--host", proxy_url, "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.duration}s",
            "--stop-timeout", "5", "--loglevel", "WARNING",
            "--rag-collection", args.collection, "--rag-topics", str(args.topics), "--rag-seed", str(args.seed),
            "--rag-stream-share", str(args.stream_share), "--rag-followup-share", str(args.followup_share),
            "--rag-paraphrase-share", str(args.paraphrase_share), "--rag-report", str(report_path),
            "--rag-tenants", str(args.tenants), "--rag-keys-per-tenant", str(args.keys_per_tenant), *keys_option,
        ]
        with (logs / "locust.log").open("wb") as output:
            subprocess.run(command, cwd=ROOT, env=clean_environ(), stdout=output, stderr=subprocess.STDOUT,
                           timeout=args.duration + 90, check=False)
        metrics = scrape_metrics(admin_url)
        proxy_rss, proxy_cpu = rss_mib(proxy.pid), cpu_seconds(proxy.pid)
        (logs / "metrics.txt").write_text(metrics, encoding="utf-8")
    if not report_path.exists():
        raise RuntimeError(f"Locust wrote no report; see {logs / 'locust.log'}")
    report: dict[str, Any] = json.loads(report_path.read_text(encoding="utf-8"))
    report["hit_ratio"] = hit_ratios(report["cache"])
    report["passages"] = passages
    report["proxy_rss_mib"] = proxy_rss
    report["proxy_cpu_s"] = proxy_cpu
    report["metric_families"] = sorted({line.split()[2] for line in metrics.splitlines()
                                        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")})
    report["setup"] = {"users": args.users, "duration_s": args.duration, "topics": args.topics,
                       "kv_blocks": args.kv_blocks, "seed": args.seed, "credits": args.credits}
    return report


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"{report['requests']} requests in {report['duration_s']:.1f} s: {report['rps']:.1f} req/s, "
             f"{report['failures']} failures ({report['setup']['users']} users, {report['passages']} passages)",
             f"{'kind':<15}{'requests':>9}{'req/s':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'failures':>9}"]
    for name, kind in sorted(report["kinds"].items()):
        lines.append(f"{name:<15}{kind['requests']:>9}{kind['rps']:>8.1f}{kind['p50_ms']:>9.0f}"
                     f"{kind['p95_ms']:>9.0f}{kind['p99_ms']:>9.0f}{kind['failures']:>9}")
    lines.append("hit ratio per tier (hits / responses that reported X-Cache-Status):")
    for name, tiers in report["hit_ratio"].items():
        lines.append(f"  {name:<15}" + "  ".join(f"{tier}={ratio:.3f}" for tier, ratio in tiers.items()))
    unreported = [name for name, tally in sorted(report["cache"].items()) if not tally["reported"]]
    if unreported:
        lines.append(f"  no X-Cache-Status from: {', '.join(unreported)}")
    credits = {name: round(tally["credits_charged"], 6) for name, tally in sorted(report["cache"].items())
               if tally["credits_reported"]}
    lines.append(f"credits charged: {credits}" if credits else "credits charged: none reported (no X-Credits-Charged)")
    lines.append(f"metric families at /metrics: {len(report['metric_families'])}; proxy at the end: "
                 f"RSS {report['proxy_rss_mib'] or float('nan'):.0f} MiB, "
                 f"CPU {report['proxy_cpu_s'] or float('nan'):.1f} s (start-up and seeding included)")
    for error in report["errors"]:
        lines.append(f"error: {error['name']}: {error['error']} x{error['occurrences']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.run_locust", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=20, help="seconds of load (default 20)")
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--spawn-rate", type=float, default=3.0, help="users started per second")
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--passages-per-topic", type=int, default=4)
    parser.add_argument("--collection", default="passages")
    parser.add_argument("--kv-blocks", type=int, default=2048, help="fake LLM KV-cache capacity in blocks")
    parser.add_argument("--slots", type=int, default=4, help="fake LLM parallel slots")
    parser.add_argument("--llm-latency-ms", type=float, default=5.0)
    parser.add_argument("--chunk-latency-ms", type=float, default=1.0)
    parser.add_argument("--stream-share", type=float, default=0.3)
    parser.add_argument("--followup-share", type=float, default=0.3)
    parser.add_argument("--paraphrase-share", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--keys-per-tenant", type=int, default=2)
    parser.add_argument("--credits", action="store_true",
                        help="auth.mode keys + credits.enabled: keys and balances made through the admin API")
    parser.add_argument("--credits-per-user", default="1000", help="top-up per user with --credits")
    parser.add_argument("--proxy-env", action="append", default=[], metavar="RAGPROXY_X=VALUE",
                        help="extra proxy setting as an environment variable (repeatable)")
    parser.add_argument("--logs", help="keep the processes' logs and the report in this folder")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line at the end")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragproxy-locust-") as scratch:
        logs = Path(args.logs) if args.logs else Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        report = run(args, logs)
    print("\n".join(summary_lines(report)))
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0 if report["failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
