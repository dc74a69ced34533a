"""llama-server replicas and SGLang's gateway for the kv benchmarks: the binary and model built or written when
missing, the processes started and stopped by this process only, and what their logs say (see
:mod:`loadtest.bench.kv`)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


CACHE = Path(os.environ.get("RAGPROXY_LLAMA_CACHE", Path.home() / ".cache" / "ragproxy"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_path(shape: str, weight_type: str) -> Path:
    """Where the random-weight model of ``shape`` is cached (the ``tiny`` F16 one keeps its historic name)."""
    if shape == "tiny" and weight_type == "f16":
        return Path(os.environ.get("RAGPROXY_TINY_GGUF", CACHE / "tiny-llama.gguf"))
    return CACHE / f"random-llama-{shape}-{weight_type}.gguf"


def ensure_binaries(shape: str = "tiny", weight_type: str = "f16", model: Path | None = None) -> tuple[Path, Path]:
    """``(llama-server, model)``, building or writing whichever is missing."""
    server = Path(os.environ.get("RAGPROXY_LLAMA_SERVER", CACHE / "llama-server"))
    if not server.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], check=True)
    if model is not None:
        return server, model
    model = model_path(shape, weight_type)
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_tiny_gguf.py"), "--out", str(model), "--shape", shape,
             "--type", weight_type, "--vocab", str(CACHE / "vocab" / "ggml-vocab-llama-spm.gguf")],
            check=True,
        )
    return server, model


MODEL_ID = "tiny"
"""The model id every replica serves (``--alias``) and every request names: smg groups its workers by it."""


PROMPT_CACHE_UPDATE = re.compile(rb"prompt cache update took ([0-9.]+) ms")
"""The line llama-server logs (verbosity 4) after each save/restore of its host-memory prompt cache."""


SLOT_SELECTED = re.compile(rb"\| selected slot by (\w+)")
"""A replica's log line for the slot it gave a request (verbosity 4): ``id`` (the request's ``id_slot``), ``LCP``
(similarity) or ``LRU``."""


def wait_until(proc: subprocess.Popen[bytes], ready: Callable[[], bool], deadline: float, what: str,
               logs: Callable[[], str]) -> None:
    """Poll ``ready`` (connection errors count as not yet) until it holds; fail when ``proc`` exits (with ``logs()``)
    or at ``deadline`` (monotonic)."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {logs()}")
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready")
        time.sleep(0.2)


class Servers:
    """Fresh llama-server replicas (started and stopped by this process only), all with the same flags."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        count: int,
        slots: int,
        ctx_per_slot: int,
        threads: int,
        cache_ram_mib: int = 2048,
        extra_args: Sequence[str] = (),
        verbosity: int | None = None,
    ) -> None:
        self.urls: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs = tempfile.TemporaryDirectory(prefix="ragproxy-llama-")
        self.log_paths: list[Path] = []
        for i in range(count):
            port = _free_port()
            path = Path(self._logs.name) / f"server-{i}.log"
            log = open(path, "wb")  # noqa: SIM115
            command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
            command += ["-c", str(ctx_per_slot * slots), "-np", str(slots), "-t", str(threads)]
            command += ["-tb", str(threads), "--poll", "0", "--no-warmup", "-b", "512", "-ub", "512"]
            command += ["--cache-ram", str(cache_ram_mib), "--alias", MODEL_ID]
            if verbosity is not None:
                command += ["-lv", str(verbosity)]
            command += list(extra_args)
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            self._procs.append(proc)
            self.log_paths.append(path)
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        for url, proc in zip(self.urls, self._procs, strict=True):
            wait_until(proc, lambda url=url: httpx.get(url + "/health", timeout=2).status_code == 200, deadline,
                       f"llama-server at {url}", lambda: f"logs in {self._logs.name}")

    def prompt_cache_updates_ms(self) -> list[float]:
        """Durations of every host prompt-cache update the replicas logged so far (needs verbosity 4)."""
        found: list[float] = []
        for path in self.log_paths:
            found += [float(m) for m in PROMPT_CACHE_UPDATE.findall(path.read_bytes())]
        return found

    def slot_choices(self) -> dict[str, int]:
        """How the replicas chose the slot of every request so far (needs verbosity 4): by the request's ``id``
        (pinned), by similarity (``LCP``) or by ``LRU``."""
        counts: dict[str, int] = {}
        for path in self.log_paths:
            for how in SLOT_SELECTED.findall(path.read_bytes()):
                counts[how.decode()] = counts.get(how.decode(), 0) + 1
        return counts

    async def wait_idle(self, client: httpx.AsyncClient, timeout_s: float = 30.0) -> None:
        """Until no slot of any replica is processing (work a client gave up on is cancelled by the server, but
        not at once), so that the next run starts on an idle machine."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls:
            while time.monotonic() < deadline:
                try:
                    slots = (await client.get(url + "/slots", timeout=5)).json()
                    if not any(s.get("is_processing") for s in slots):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._logs.cleanup()


def find_smg() -> Path | None:
    """SGLang's model gateway (``pip install smg``): ``RAGPROXY_SMG``, else ``smg`` on the PATH or beside this
    Python; ``None`` when there is none (it is no dependency of this project)."""
    if os.environ.get("RAGPROXY_SMG"):
        given = Path(os.environ["RAGPROXY_SMG"])
        return given if given.exists() else None
    found = shutil.which("smg")
    if found:
        return Path(found)
    beside = Path(sys.executable).parent / "smg"
    return beside if beside.exists() else None


class Smg:
    """``smg launch`` (started and stopped by this process) in front of ``urls`` with its ``cache_aware`` policy:
    what a team would put in front of its replicas instead of ragproxy."""

    def __init__(self, binary: Path, urls: Sequence[str], policy: str = "cache_aware") -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.NamedTemporaryFile(prefix="ragproxy-smg-", suffix=".log")  # noqa: SIM115
        command = [str(binary), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                   "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
                   "--worker-startup-check-interval", "1", "--log-level", "warn"]
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the gateway lists the replicas' model (it has registered its workers)."""
        def listed() -> bool:
            response = httpx.get(self.url + "/v1/models", timeout=2)
            return response.status_code == 200 and MODEL_ID in response.text

        def tail() -> str:
            self._log.seek(0)
            return self._log.read()[-2000:].decode(errors="replace")

        wait_until(self._proc, listed, time.monotonic() + timeout_s, f"smg at {self.url}", tail)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a CI job stopped) into ``SystemExit``, so that ``finally`` stops the replicas
    instead of leaving them running (holding a GPU's memory for the next run)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
