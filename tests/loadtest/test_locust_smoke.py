"""A short Locust run of the RAG scenario through ragproxy and the upstream test doubles (CI's load smoke test).

``python -m loadtest.run_locust --duration 10 --users 4 --credits --json`` starts the fake LLM (KV model), the
TEST-ONLY Qdrant shim and ``ragproxy serve`` (``auth.mode: keys``, credits on; API keys and balances for three
tenants made through the admin API) on loopback ports, runs Locust headless and prints its report as the last
line. Verified: every request kind was sent and none failed, repeated questions were answered from a cache
tier (non-zero hit ratio read from the proxy's ``X-Cache-Status``/``X-Cache-Tier`` headers), credits were
charged (``X-Credits-Charged``), and the admin port served Prometheus metrics. No latency or
throughput is asserted (shared machines); the long run in docs/operations.md is where figures come from.
Also verified: the locustfile refuses a non-loopback host before sending anything.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from loadtest.rag_users import CacheTally, ZipfSampler, hit_ratios
from tests.support.nq_open import needs_nq_open

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long
@needs_nq_open
def test_short_run_has_no_failures_and_hits(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.run_locust", "--duration", "10", "--users", "4", "--spawn-rate", "4",
         "--credits", "--logs", str(tmp_path), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in tmp_path.glob("*.log"))
    assert result.returncode == 0, result.stdout + result.stderr + logs
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == 0 and report["errors"] == [], report["errors"]
    assert {"embed", "search", "chat"} <= set(report["kinds"])
    assert report["hit_ratio"]["all"]["any"] > 0
    assert report["hit_ratio"]["chat"].get("l1", 0) > 0 or report["hit_ratio"]["embed"]["any"] > 0
    assert report["cache"]["chat"]["credits_reported"] > 0 and report["cache"]["chat"]["credits_charged"] > 0
    assert "ragproxy_requests_total" in report["metric_families"]


def test_locustfile_refuses_non_loopback_hosts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless", "-u", "1", "-t", "2s",
         "--host", "http://192.0.2.1:8080", "--rag-report", str(tmp_path / "report.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "only loopback hosts" in result.stderr + result.stdout
    assert not (tmp_path / "report.json").exists()


def test_zipf_sampler_prefers_low_ranks() -> None:
    sampler = ZipfSampler(50, 1.1, random.Random(1))
    counts = Counter(sampler.sample() for _ in range(5000))
    assert set(counts) <= set(range(50))
    assert counts[0] > counts[1] > counts[10]


def test_tally_merges_and_computes_ratios() -> None:
    first, second = CacheTally(), CacheTally()
    first.record("chat", {"X-Cache-Status": "HIT", "X-Cache-Tier": "l1", "X-Credits-Charged": "2.5"})
    first.record("chat", {"X-Cache-Status": "MISS"})
    second.record("chat", {"X-Cache-Status": "SEMANTIC_HIT", "X-Cache-Tier": "l2"})
    second.record("search", {})
    first.merge(second.to_dict())
    data = first.to_dict()
    assert data["chat"]["responses"] == 3 and data["chat"]["credits_charged"] == 2.5
    ratios = hit_ratios(data)
    assert ratios["chat"] == {"l1": 1 / 3, "l2": 1 / 3, "any": 2 / 3}
    assert "search" not in ratios
