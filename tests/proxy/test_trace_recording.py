"""The proxy records its own cache trace, and ``ragproxy simulate`` replays it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM


def test_recorded_trace_replays_through_the_simulator(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    settings = proxy_settings(fake_llm_thread.url, **{"cache.trace_file": str(trace)})
    with ProxyServer(settings) as server:
        for question in ["a", "b", "a", "a", "c", "b"]:
            httpx.post(server.url + "/v1/chat/completions",
                       json={"model": "fake-model", "messages": [{"role": "user", "content": question}]})
        time.sleep(0.2)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == 6
    assert len({r["key"] for r in records}) == 3
    assert all(r["size"] > 0 and r["cost"] >= 0 for r in records)
    result = subprocess.run([sys.executable, "-m", "commands.cli", "simulate", str(trace), "--policy", "lru",
                             "--capacity", "100000", "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    [replayed] = json.loads(result.stdout.strip().splitlines()[-1])["results"]
    assert replayed["hits"] == 3 and replayed["object_hit_ratio"] == 0.5  # a, b, a, a, c, b: three repeats
