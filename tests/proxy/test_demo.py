"""``ragproxy demo``: the tiers at work in front of the built-in test upstreams, without any backend; ``--serve`` keeps
it running for the curl lines it prints and for the README's curl blocks, which run here as they are written."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.commands import Output, ragproxy, site_without_model, start
from tests.support.processes import free_port

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _steps(stdout: str) -> list[tuple[str, str]]:
    """(cache status, upstream column) of each line of the tour (a step's line is followed by its ``->`` line)."""
    cells = [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines()
             if line.startswith("  ") and re.search(r"(called|forwarded)$", line)]
    return [(row[1], row[2]) for row in cells]


def _demo(*args: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ragproxy("demo", *args, site=site), capture_output=True, text=True, timeout=110,
                          env={**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def test_demo_shows_each_tier_and_exits_0() -> None:
    done = _demo()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TEST upstreams" in done.stdout
    called, skipped, forwarded = "upstream called", "upstream not called", "forwarded"
    assert _steps(done.stdout) == [("MISS", called), ("HIT l1", skipped), ("SEMANTIC_HIT l2", skipped),
                                   ("HTTP 200", forwarded), ("HTTP 200", forwarded), ("MISS", called),
                                   ("HIT retrieval", skipped), ("SEMANTIC_HIT retrieval", skipped)]
    answers = [line.strip() for line in done.stdout.splitlines() if line.startswith("      -> 'Demo answer")]
    assert len(answers) == 3 and len(set(answers)) == 1, "the hits replay the first answer"
    assert "Traceback" not in done.stderr


def test_demo_into_a_pipe_closed_early_stops_without_a_traceback() -> None:
    """``ragproxy demo | head -3``: the closed pipe ends the demo quietly."""
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shlex.join(ragproxy("demo")) + " | head -3"],
                          capture_output=True, text=True, timeout=110)
    assert len(done.stdout.splitlines()) == 3
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr

def test_demo_without_the_model_package_says_so_and_skips_the_paraphrase(tmp_path: Path) -> None:
    done = _demo(site=site_without_model(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "  (no paraphrase step: L2 semantic off: the embedding model package is missing" in done.stdout
    assert [status for status, _ in _steps(done.stdout)][:3] == ["MISS", "HIT l1", "HTTP 200"]


def _readme_section(heading: str) -> tuple[list[str], str]:
    """The ``ragproxy`` arguments of a README section's first block, and its second block (the curl script)."""
    section = README.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    server, script = re.findall(r"```bash\n(.*?)```", section, re.S)
    [command] = [line for line in server.splitlines() if line.startswith(".venv/bin/ragproxy ")]
    return shlex.split(command)[1:], script


def _serving_demo(args: list[str]) -> tuple[subprocess.Popen[bytes], Output, Output, int, int]:
    port, admin = free_port(), free_port()
    process, out, err = start(ragproxy(*args, "--port", str(port), "--admin-port", str(admin)))
    out.wait_for(lambda line: line.startswith("Try it yourself"), timeout=90)
    return process, out, err, port, admin


def _bash(script: str, port: int, admin: int) -> str:
    local = script.replace("127.0.0.1:8080", f"127.0.0.1:{port}").replace("127.0.0.1:8081", f"127.0.0.1:{admin}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", local], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _in_order(output: str, expected: list[str]) -> None:
    position = 0
    for text in expected:
        found = output.find(text, position)
        assert found >= 0, f"{text!r} not found after position {position} in:\n{output}"
        position = found + len(text)


@pytest.mark.long
@pytest.mark.parametrize("heading", ["The tiers, by curl", "Credits, by curl", "Documents, by curl"])
def test_readme_curl_blocks_run_against_demo_serve(heading: str) -> None:
    args, script = _readme_section(heading)
    assert args[:2] == ["demo", "--serve"]
    process, out, err, port, admin = _serving_demo(args)
    try:
        printed = "\n".join(line for line in out.lines if line.startswith("curl "))
        assert printed.count("curl ") >= 4
        _in_order(_bash(printed, port, admin), ["X-Cache-Status: MISS", "X-Cache-Status: HIT", "X-Cache-Status: MISS"])
        expected = [line.removeprefix("# -> ") for line in script.splitlines() if line.startswith("# -> ")]
        _in_order(_bash(script, port, admin), expected)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert "Traceback" not in err.text() and "Unclosed" not in err.text()


def test_demo_serve_stops_cleanly_on_sigterm() -> None:
    process, _out, err, _port, _ = _serving_demo(["demo", "--serve"])
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert err.text() == ""


def test_demo_serve_handles_a_signal_sent_as_soon_as_it_prints() -> None:
    """The handlers are installed before the first line: whoever reads the output may signal at once."""
    process, out, err = start(ragproxy("demo", "--serve", "--port", str(free_port()), "--admin-port",
                                       str(free_port())))
    out.wait_for(lambda line: line.startswith("ragproxy demo:"), timeout=90)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=90) == 0, err.text()


def test_the_demo_llm_answers_the_last_user_message_and_counts_its_answers() -> None:
    from commands.demo.tour import DemoAnswers
    from upstream_doubles.openai_shapes import prompt_of_messages

    answer = DemoAnswers()
    chat = prompt_of_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}])
    assert answer(chat) == "Demo answer #1 to: Why?"
    assert answer(prompt_of_messages([{"role": "user", "content": "Who?"}])) == "Demo answer #2 to: Who?"
    assert answer("a completions prompt") == "Demo answer #3 to: a completions prompt"
