"""The end-to-end side of the kv benchmarks: a real ``ragproxy serve`` process in front of its own llama-server
replicas, driven over HTTP as an app drives it (see :mod:`loadtest.bench.kv_load`).

It is started the way the operations guide says, with the command line a user types: one
``--llm-upstream URL,kind=llamacpp,slots=N`` per replica and ``--set routing.order=...``, plus
:data:`SERVE_SETTINGS` (the answer cache off: every question of the workloads is new, so the cache could only
miss, and its embedding work would compete with the replicas for the machine's cores) and the ``--serve-set``
settings given to the bench.

The ``fleet`` side (:class:`ServeFleet`) runs several of these processes in front of the same replicas, in shared
mode (``redis.url``: one redis-server of the bench's own, on a free loopback port, no persistence), the way
docs/scale-out.md says to run replicas of the proxy: each reads the others' prefix summaries through Redis
(:class:`~proxy.kv.prefix_board.PrefixSummaryBoard`), so that a request routed by one proxy finds the prefixes the
others sent. Nothing else is shared between them: each proxy's admission and its view of the replicas' load and
slots are its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from loadtest.bench._kv_servers import ROOT, wait_until
from loadtest.harness import free_port, redis_server

SERVE_SETTINGS = ("cache.enabled=false", "logging.level=warning")
"""What the bench sets beyond the replicas and the order (see the module)."""

KEEP_LOGS_ENV = "KV_BENCH_SERVE_LOGS"  # not RAGPROXY_*: the proxy reads those as settings
"""When set, a folder each ``ragproxy serve`` process's log is copied into when it stops (``serve-<port>.log``)."""


def serve_command(
    urls: Sequence[str],
    *,
    slots: int,
    order: str,
    port: int,
    admin_port: int,
    data_dir: Path,
    slo_s: float | None = None,
    settings: Sequence[str] = (),
) -> list[str]:
    """The ``ragproxy serve`` command line (as ``python -m commands.cli``) for ``urls``, each a llama.cpp replica of
    ``slots`` slots; ``slo_s`` sets ``routing.ttft_slo_s``; ``settings`` (``KEY=VALUE``) come last and win."""
    command = [
        sys.executable,
        "-m",
        "commands.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
        "--data-dir",
        str(data_dir),
    ]
    for url in urls:
        command += ["--llm-upstream", f"{url},kind=llamacpp,slots={slots}"]
    command += ["--set", f"routing.order={order}"]
    if slo_s is not None:
        command += ["--set", f"routing.ttft_slo_s={slo_s:g}"]
    for setting in (*SERVE_SETTINGS, *settings):
        command += ["--set", setting]
    return command


class Serve:
    """``ragproxy serve`` in front of ``urls`` (started and stopped by this process), its output in a log file."""

    def __init__(
        self, urls: Sequence[str], *, slots: int, order: str, slo_s: float | None = None, settings: Sequence[str] = ()
    ) -> None:
        port, admin_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.admin_url = f"http://127.0.0.1:{admin_port}"
        self._dir = tempfile.TemporaryDirectory(prefix="ragproxy-serve-")
        self.log_path = Path(self._dir.name) / "serve.log"
        self.command = serve_command(
            urls,
            slots=slots,
            order=order,
            port=port,
            admin_port=admin_port,
            data_dir=Path(self._dir.name) / "data",
            slo_s=slo_s,
            settings=settings,
        )
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(self.command, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the proxy answers ``/readyz``."""
        wait_until(
            self._proc,
            lambda: httpx.get(self.url + "/readyz", timeout=2).status_code == 200,
            time.monotonic() + timeout_s,
            f"ragproxy serve at {self.url}",
            self.log_tail,
        )

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()
        keep = os.environ.get(KEEP_LOGS_ENV)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log_path, Path(keep) / f"serve-{self.url.rsplit(':', 1)[1]}.log")
        self._dir.cleanup()


def shared_settings(redis_url: str) -> tuple[str, ...]:
    """What makes a ``ragproxy serve`` one of a fleet: shared mode on ``redis_url`` (docs/scale-out.md)."""
    return (f"redis.url={redis_url}",)


class ServeFleet:
    """``count`` ``ragproxy serve`` processes in shared mode, each in front of every one of ``urls`` (the same
    command line as :class:`Serve`, plus :func:`shared_settings`), and the redis-server they share; all started and
    stopped by this process."""

    def __init__(
        self, urls: Sequence[str], *, count: int, slots: int, order: str, slo_s: float | None = None,
        settings: Sequence[str] = (),
    ) -> None:
        if count < 1:
            raise ValueError("a fleet needs at least one proxy")
        self._stack = contextlib.ExitStack()
        self.redis_url = self._stack.enter_context(redis_server())
        self.proxies: list[Serve] = []
        try:
            for _ in range(count):
                proxy = Serve(urls, slots=slots, order=order, slo_s=slo_s,
                              settings=(*shared_settings(self.redis_url), *settings))
                self.proxies.append(proxy)
                self._stack.callback(proxy.stop)
        except BaseException:
            self._stack.close()
            raise

    @property
    def urls(self) -> list[str]:
        """The proxies' URLs, in the order clients are dealt to them."""
        return [proxy.url for proxy in self.proxies]

    def wait_ready(self, timeout_s: float = 120) -> None:
        for proxy in self.proxies:
            proxy.wait_ready(timeout_s)

    def stop(self) -> None:
        """Every proxy (last started first), then the redis-server."""
        self._stack.close()
