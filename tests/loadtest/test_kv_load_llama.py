"""The load benchmark end to end against real llama-server replicas (``-m llama``; ~40 s).

Needs ``scripts/build_llama_server.sh`` and ``scripts/make_tiny_gguf.py`` to have run (skipped otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench import kv_load

CACHE = Path.home() / ".cache" / "ragproxy"
pytestmark = pytest.mark.llama


def test_both_sides_answer_and_the_figures_come_from_the_servers_timings(capsys: pytest.CaptureFixture[str]) -> None:
    if not (CACHE / "llama-server").exists() or not (CACHE / "tiny-llama.gguf").exists():
        pytest.skip("run scripts/build_llama_server.sh and scripts/make_tiny_gguf.py first")
    # a low rate and a rate far beyond two tiny replicas, with a tight objective: the proxy must refuse some
    assert kv_load.main(["--json", "--docs", "4", "--calibration", "2", "--duration", "4", "--rates", "0.5,30",
                         "--slo-factor", "1.5"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    low, high = result["rates"]
    assert low["direct"]["sent"] == low["proxy"]["sent"] > 0  # the same requests at the same times
    assert low["direct"]["goodput_rps"] > 0 and low["proxy"]["goodput_rps"] > 0
    assert 0 < low["proxy"]["prefill_share"] <= 1 and low["direct"]["reuse"] >= 0
    assert high["proxy"]["rejected"] > 0  # 429 at the objective, counted apart, never as goodput
    assert high["direct"]["rejected"] == 0  # the direct side has nobody to refuse
    assert high["proxy"]["goodput_rps"] <= high["proxy"]["sent"] / result["duration_s"]
    assert result["calibration"]["prompt_cache_ms_per_request"] >= 0  # read from the replicas' own logs
    for side in result["sides"]:  # every side got the same requests; capacity fitted for each
        assert low[side]["sent"] == low["direct"]["sent"] and low[side]["goodput_rps"] > 0
        assert result["capacity_rps"][side] is not None
    assert high["preserve"]["rejected"] > 0  # the proxy keeping retrieval order refuses at the objective too
    assert result["side_kinds"]["serve"].startswith("end to end")  # a real ragproxy serve, over HTTP
    assert high["serve"]["rejected"] == 0  # started without an objective (no --slo-ms): it sends everything
    assert result["http_errors_by_side"]["direct"] == {}
    if "smg" in result["sides"]:
        assert high["smg"]["rejected"] == 0 and result["capacity_ratio_vs_smg"] is not None
    # the prefill bound over the load runs, priced by a fit to the calibration's timings (4 requests x every side)
    assert result["prefill_bound_peer"] == ("smg" if "smg" in result["sides"] else "direct")
    assert result["prefill_bound_fit"]["rows"] >= 8 and result["prefill_bound_time"] is not None


def test_the_zipf_rag_workload_pasted_reaches_every_side_streamed(capsys: pytest.CaptureFixture[str]) -> None:
    if not (CACHE / "llama-server").exists() or not (CACHE / "tiny-llama.gguf").exists():
        pytest.skip("run scripts/build_llama_server.sh and scripts/make_tiny_gguf.py first")
    assert kv_load.main(["--json", "--workload", "zipf-rag", "--present", "pasted", "--docs", "8", "--calibration",
                         "3", "--duration", "4", "--rates", "0.5", "--sides", "direct,serve,proxy"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["workload"] == "zipf-rag" and result["present"] == "pasted"
    (low,) = result["rates"]
    for side in ("direct", "serve", "proxy"):
        assert low[side]["sent"] == low["direct"]["sent"] > 0 and low[side]["goodput_rps"] > 0
    assert result["calibration"]["prefix_token_reuse_serve"] > 0  # streamed replies carried the servers' timings
