"""``python -m loadtest.bench qdrant_hits --before DIR [--quick] [--json]``: the proxy's CPU per Qdrant search answered
from the search cache, this tree against another checkout of ragproxy (``DIR``: e.g. ``git worktree add /tmp/base
<commit>``), measured in one run.

Both ``ragproxy serve`` processes run in keys mode with the search cache on, in front of one TEST-ONLY Qdrant shim
(:mod:`upstream_doubles.qdrant_shim`); each gets a tenant's key, a collection made through it and one warm-up search.
Then rounds of identical searches (every one a ``HIT``: the upstream is not involved) alternate between the two, the
order swapped every round so that drift on a shared machine hits both alike, and each process's CPU time (user +
system, ``/proc``) is read around its rounds. The figure is CPU microseconds per search hit and the ratio of this tree
to ``DIR``: what building each request from its row in the tenant's namespace costs on the hottest Qdrant path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness import cpu_seconds, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
BODY = {"query": [1.0, 0.3, 0.5, 0.1], "limit": 5, "with_payload": True}


def _serve(tree: Path, qdrant_url: str, tenant: str) -> tuple[subprocess.Popen[bytes], str, httpx.Client]:
    """``ragproxy serve`` from ``tree``; its process, base URL and a client with a key of ``tenant``."""
    data_dir = tempfile.mkdtemp(prefix="ragproxy-qdrant-hits-")
    port, admin_port = free_port(), free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}, "PYTHONPATH": str(tree),
           "RAGPROXY_SERVER__PORT": str(port), "RAGPROXY_ADMIN__PORT": str(admin_port),
           "RAGPROXY_UPSTREAMS__LLM": '[{"url": "http://127.0.0.1:9"}]', "RAGPROXY_UPSTREAMS__QDRANT__URL": qdrant_url,
           "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CACHE__L2__ENABLED": "false", "RAGPROXY_DATA_DIR": data_dir,
           "RAGPROXY_LOGGING__LEVEL": "warning"}
    process = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve"], env=env, cwd=tree,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, 60)
    with httpx.Client(base_url=f"http://127.0.0.1:{admin_port}", timeout=30) as admin:
        for _ in range(100):
            try:
                admin.get("/admin/stats")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        key = admin.post("/admin/keys", json={"user": tenant, "tenant": tenant}).json()["key"]
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"api-key": key}, timeout=30)
    collection = f"/collections/hits_{tenant}"  # one upstream name whatever the tree's tenancy
    client.put(collection, json={"vectors": {"size": 4, "distance": "Cosine"}}).raise_for_status()
    client.put(collection + "/points?wait=true", json={"points": [
        {"id": n, "vector": [1.0, n / 10, 0.5, 0.1], "payload": {"text": f"passage {n}"}} for n in range(50)]}
               ).raise_for_status()
    client.post(collection + "/points/query", json=BODY).raise_for_status()
    return process, collection, client


def run(before: Path, rounds: int, per_round: int) -> dict[str, Any]:
    from upstream_doubles.qdrant_shim import QdrantShim

    sides = {"before": before, "this_tree": ROOT}
    with QdrantShim() as shim:
        served = {name: _serve(tree, shim.url, name) for name, tree in sides.items()}
        try:
            cpu = dict.fromkeys(sides, 0.0)
            for n in range(rounds):
                for name in (list(sides) if n % 2 == 0 else list(reversed(list(sides)))):
                    process, collection, client = served[name]
                    started = cpu_seconds(process.pid)
                    for _ in range(per_round):
                        answer = client.post(collection + "/points/query", json=BODY)
                        if answer.headers.get("X-Cache-Status") != "HIT":
                            raise SystemExit(f"{name}: a search was not a hit: {answer.status_code} {answer.text}")
                    cpu[name] += cpu_seconds(process.pid) - started
        finally:
            for process, _, client in served.values():
                client.close()
                process.terminate()
                process.wait(30)
    searches = rounds * per_round
    per = {name: round(seconds / searches * 1e6, 1) for name, seconds in cpu.items()}
    return {"benchmark": "qdrant_hits", "before": str(before), "searches_each": searches,
            "cpu_us_per_search_hit": per, "ratio_to_before": round(per["this_tree"] / per["before"], 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench qdrant_hits", description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout of ragproxy to compare with")
    parser.add_argument("--quick", action="store_true", help="6 rounds of 300 searches each (else 10 of 1,000)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    result = run(args.before.resolve(), 6 if args.quick else 10, 300 if args.quick else 1000)
    for name, value in result.items():
        print(f"{name:>22}: {json.dumps(value) if isinstance(value, dict) else value}")
    if args.json:
        print(json.dumps(result))
    return 0
