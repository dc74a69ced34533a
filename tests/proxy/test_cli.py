"""The ``ragproxy`` command as a newcomer meets it: ``check-config`` refuses whatever ``serve`` refuses (exit 2, one
line), a port in use is one line and exit 1 with nothing left open, and ``--llm-upstream URL,kind=KIND`` needs no
YAML."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.processes import free_port, wait_for_port
from upstream_doubles.llm_server import FakeLLM


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.cli", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, cwd=cwd, timeout=90)


REFUSED = [
    (["--set", "admin.host=0.0.0.0"], "admin.token"),
    (["--set", "cache.l1.policy=nope"], "cache.l1.policy = 'nope': unknown eviction policy"),
    (["--set", "cache.l3.policy=nope"], "cache.l3.policy = 'nope': unknown eviction policy"),
    (["--set", "cache.retrieval.policy=nope"], "cache.retrieval.policy = 'nope': unknown eviction policy"),
    (["--set", "cache.l2.vector_store=qdrant"], "cache.l2: vector_store is qdrant but qdrant_url is not set"),
    (["--set", "cache.l2.embedder=upstream"], "cache.l2: embedder is upstream but upstream_url is not set"),
    (["--set", "credits.store=redis"], "credits.store is redis but redis.url is not set"),
    (["--set", "redis.url=redis://127.0.0.1:1/0", "--set", "redis.prefix=a{b}"], "redis.prefix = 'a{b}': must not"),
]


@pytest.mark.parametrize(("flags", "reason"), REFUSED, ids=[flags[-1] for flags, _ in REFUSED])
def test_check_config_refuses_what_serve_refuses(flags: list[str], reason: str, tmp_path: Path) -> None:
    where = ["--port", str(free_port()), "--admin-port", str(free_port()), "--data-dir", str(tmp_path)]
    checked = _cli("check-config", *where, *flags)
    assert checked.returncode == 2, checked.stdout
    assert checked.stderr.count("\n") == 1 and reason in checked.stderr
    assert checked.stderr.startswith("ragproxy: invalid configuration: ")
    served = _cli("serve", *where, *flags)
    assert served.returncode == 2
    assert served.stderr == checked.stderr.replace("invalid configuration", "refusing to start")


@pytest.mark.parametrize("taken", ["server.port", "admin.port"])
def test_a_port_in_use_is_one_line_and_exit_1(taken: str, fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        ports = {"server.port": str(busy if taken == "server.port" else free_port()),
                 "admin.port": str(busy if taken == "admin.port" else free_port())}
        done = _cli("serve", "--llm-upstream", fake_llm_thread.url, "--port", ports["server.port"],
                    "--admin-port", ports["admin.port"], "--data-dir", str(tmp_path),
                    "--set", "cache.l2.enabled=false", "--set", "logging.format=text")
    assert done.returncode == 1
    assert done.stderr == f"ragproxy: cannot listen on http://127.0.0.1:{busy} ({taken}): Address already in use\n"


def test_llm_upstream_with_options_needs_no_yaml() -> None:
    done = _cli("check-config", "--llm-upstream", "http://gpu-0:8080/v1,kind=llamacpp,slots=4",
                "--llm-upstream", "http://gpu-1:8000,kind=vllm,name=b")
    assert done.returncode == 0, done.stderr
    llm = yaml.safe_load(done.stdout)["upstreams"]["llm"]
    assert [(r["url"], r["kind"], r["slots"], r["name"]) for r in llm] == [
        ("http://gpu-0:8080", "llamacpp", 4, None), ("http://gpu-1:8000", "vllm", 1, "b")]


@pytest.mark.parametrize(("value", "reason"), [
    ("http://gpu-0:8080,kind=tgi", "upstreams.llm.0.kind = 'tgi': allowed: openai, vllm, sglang, llamacpp, generic"),
    ("http://gpu-0:8080,colour=red", "'colour' is not OPTION=VALUE with an OPTION of name, kind,"),
    ("http://gpu-0:8080,api_key=sk-1", "name the environment variable holding it: api_key_env=NAME"),
    ("http://gpu-0:8080,kind", "'kind' is not OPTION=VALUE"),
    ("gpu-0:8080", "upstreams.llm.0.url = 'gpu-0:8080': must be an http:// or https:// URL"),
])
def test_a_bad_llm_upstream_flag_is_one_line(value: str, reason: str) -> None:
    done = _cli("check-config", "--llm-upstream", value)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and reason in done.stderr
    assert "sk-1" not in done.stderr


@pytest.mark.parametrize(("command", "option"), [("calibrate", "--target"), ("simulate", "--policy")])
def test_subcommands_with_their_own_options_show_them_in_help(command: str, option: str) -> None:
    done = _cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"ragproxy {command}" in done.stdout and option in done.stdout


def test_calibrate_takes_its_options_before_the_file(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("question1,question2,is_duplicate\n"
                     "How tall is the Eiffel tower?,What is the height of the Eiffel tower?,1\n"
                     "Who painted the Mona Lisa?,Who painted the Night Watch?,0\n")
    done = _cli("calibrate", "--target", "0.5", str(pairs))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("default: no threshold keeps wrong hits within 0.5 (2 pairs)"), done.stdout


def test_one_port_for_both_sites_is_refused_by_check_config_as_by_serve(tmp_path: Path) -> None:
    port = str(free_port())
    checked = _cli("check-config", "--port", port, "--admin-port", port, "--data-dir", str(tmp_path))
    assert checked.returncode == 2
    assert checked.stderr == f"ragproxy: invalid configuration: admin.port {port} is server.port too; the admin API " \
                             "needs a port of its own\n"
    served = _cli("serve", "--port", port, "--admin-port", port, "--data-dir", str(tmp_path))
    assert served.returncode == 2 and served.stderr == checked.stderr.replace("invalid configuration",
                                                                              "refusing to start")


def test_a_hosted_upstream_takes_its_key_from_the_environment() -> None:
    flag = "https://api.openai.com/v1,api_key_env=UPSTREAM_KEY"
    done = _cli("check-config", "--llm-upstream", flag, env={"UPSTREAM_KEY": "sk-secret-1"})
    assert done.returncode == 0, done.stderr
    [llm] = yaml.safe_load(done.stdout)["upstreams"]["llm"]
    assert (llm["url"], llm["api_key_env"], llm["api_key"]) == ("https://api.openai.com", "UPSTREAM_KEY", "**********")
    assert "sk-secret-1" not in done.stdout
    missing = _cli("check-config", "--llm-upstream", flag)
    assert missing.returncode == 2 and missing.stderr == (
        "ragproxy: invalid configuration: upstreams.llm.0: api_key_env: the environment variable UPSTREAM_KEY is not "
        "set\n")


def test_version() -> None:
    from importlib import metadata

    done = _cli("--version")
    assert (done.returncode, done.stdout) == (0, f"ragproxy {metadata.version('ragproxy')}\n")


def test_a_second_serve_on_one_data_dir_is_one_line_and_exit_1(fake_llm_thread: FakeLLM, tmp_path: Path) -> None:
    def flags() -> list[str]:
        return ["--llm-upstream", fake_llm_thread.url, "--port", str(free_port()), "--admin-port", str(free_port()),
                "--data-dir", str(tmp_path), "--set", "cache.l2.enabled=false", "--set", "logging.format=text"]

    first_flags = flags()
    first = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve", *first_flags],
                             env={"PATH": "/usr/bin:/bin"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(int(first_flags[3]), timeout=60)
        second = _cli("serve", *flags())
        assert second.returncode == 1
        assert second.stderr == (f"ragproxy: data directory {str(tmp_path)!r} is in use by another ragproxy (pid "
                                 f"{first.pid}); give each process its own --data-dir (data_dir)\n")
    finally:
        first.terminate()
        assert first.wait(timeout=30) == 0
