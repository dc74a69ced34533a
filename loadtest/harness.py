"""Benchmark plumbing: child processes on loopback ports, latency percentiles, closed-loop load, the admin ledger."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

_HANDED_OUT: deque[int] = deque(maxlen=1024)
"""The ports :func:`free_port` gave lately: the kernel may hand a port it just freed out again, and two ports asked
for one after the other (a proxy's data and admin ports) must differ."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now, and not one this process was given lately."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1",
                  process: subprocess.Popen[bytes] | None = None) -> None:
    """Block until something accepts connections on ``port``; fail at once if ``process`` (the one that should
    listen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


@contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server of this process's own on a free loopback port (never the machine's 6379), no persistence, its
    files in a temporary folder; yields its URL and stops it on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ragproxy-bench-redis-") as directory:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                    "no", "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, process=process)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


@contextmanager
def child(args: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A Python child process that listens on ``port``; stopped on exit."""
    with listening([sys.executable, *args], port, env) as process:
        yield process


@contextmanager
def listening(command: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A process running ``command`` that listens on ``port``; stopped on exit."""
    process = subprocess.Popen(command, env={**os.environ, **(env or {})},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process=process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def proxy_child(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ragproxy serve`` configured by ``RAGPROXY_*`` variables; yields its base URL and its process."""
    port = free_port()
    full = {"RAGPROXY_SERVER__PORT": str(port), "RAGPROXY_ADMIN__PORT": str(free_port()),
            "RAGPROXY_LOGGING__LEVEL": "warning", **env}
    with child(["-m", "commands.cli", "serve"], port, full) as process:
        yield f"http://127.0.0.1:{port}", process


@contextmanager
def proxy_process(env: dict[str, str]) -> Iterator[str]:
    """``ragproxy serve`` configured by ``RAGPROXY_*`` variables; yields its base URL."""
    with proxy_child(env) as (url, _):
        yield url


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux ``/proc``; clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(samples_s: list[float]) -> dict[str, float]:
    """p50/p99 in milliseconds."""
    array = np.asarray(samples_s) * 1000.0
    return {"p50_ms": float(np.percentile(array, 50)), "p99_ms": float(np.percentile(array, 99))}


async def closed_loop(call: Callable[[], Awaitable[None]], concurrency: int, total: int) -> tuple[float, list[float]]:
    """Run ``total`` calls with ``concurrency`` workers; (requests per second, latencies in seconds)."""
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - started), latencies


def ledger_charges(admin: httpx.Client, user: str, since: float | None = None) -> list[dict[str, Any]]:
    """Every charge of ``user`` in the ledger (``since``: epoch seconds), page by page through the admin API."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"user": user, "kind": "charge", "limit": 500}
        if since is not None:
            params["since"] = since
        if cursor:
            params["cursor"] = cursor
        page = admin.get("/admin/ledger", params=params).json()
        entries.extend(page["entries"])
        cursor = page.get("next_cursor")
        if not cursor:
            return entries


def new_key(admin: httpx.Client, user: str, tenant: str) -> dict[str, str]:
    """A new API key of ``user`` in ``tenant`` from a proxy's admin API (once it listens), as request headers."""
    for _ in range(100):
        try:
            admin.get("/admin/stats")
            break
        except httpx.TransportError:
            time.sleep(0.1)
    key = admin.post("/admin/keys", json={"user": user, "tenant": tenant}).json()["key"]
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def keyed_replica(llm_url: str, data_dir: Path, *, semantic: bool) -> Iterator[tuple[str, httpx.Client]]:
    """An embedded ``ragproxy serve`` of one abuse scenario's own: API keys, caching on (L2 as ``semantic`` says),
    credits off, in front of ``llm_url``; yields its base URL and a client of its admin API."""
    admin_port = free_port()
    env = {"RAGPROXY_ADMIN__PORT": str(admin_port), "RAGPROXY_UPSTREAMS__LLM": f'[{{"url": "{llm_url}"}}]',
           "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "false", "RAGPROXY_CACHE__ENABLED": "true",
           "RAGPROXY_CACHE__L2__ENABLED": str(semantic).lower(), "RAGPROXY_DATA_DIR": str(data_dir),
           "RAGPROXY_LOGGING__FORMAT": "text"}
    with proxy_child(env) as (url, _), httpx.Client(base_url=f"http://127.0.0.1:{admin_port}", timeout=30) as admin:
        yield url, admin
