"""The proxy under test, run the ways tests need it: on a background thread (sync SDK clients and async tests
alike), or as a separate ``ragproxy serve`` process (signals, kills, several replicas)."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from aiohttp import web

from proxy.assembly.app import DataPlane, create_server
from proxy.assembly.config import Settings, load_settings
from proxy.assembly.runtime import Runtime
from proxy.cache_tiers.cold import ColdTier
from proxy.cache_tiers.semantic import SemanticCacheTier
from proxy.core.endpoints import ENDPOINTS, Endpoint
from proxy.server.connection import HttpServer
from tests.support.processes import free_port, wait_for_port
from tiers.demotion import Demoter
from tiers.response_tier import ResponseTier

T = TypeVar("T")


def proxy_settings(llm_url: str | list[str] | None = None, qdrant_url: str | None = None,
                   **overrides: Any) -> Settings:
    """Settings for a test proxy: free ports, the given upstreams, dotted-key overrides."""
    values: dict[str, Any] = {"server.port": free_port(), "admin.port": free_port(), "logging.format": "text",
                              "upstreams.health_interval_s": 0.5,
                              # the semantic tier loads a model; its own tests switch it on
                              "cache.l2.enabled": False,
                              # no would-be hit forwarded at random to check it: a test of a hit must see the hit
                              "cache.l2.verify_fraction": 0.0,
                              "data_dir": tempfile.mkdtemp(prefix="ragproxy-test-")}
    if llm_url is not None:
        urls = [llm_url] if isinstance(llm_url, str) else llm_url
        values["upstreams.llm"] = [{"url": url} for url in urls]
    if qdrant_url is not None:
        values["upstreams.qdrant.url"] = qdrant_url
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return load_settings(env={}, overrides=values)


class ProxyServer:
    """The data-plane app on a loopback port, served from its own thread and event loop; with ``admin=True``
    the admin app too, on ``settings.admin.port`` (``admin_url``)."""

    def __init__(self, settings: Settings, runtime: Runtime | None = None, *, admin: bool = False,
                 endpoints: Iterable[Endpoint] = ENDPOINTS) -> None:
        """``endpoints``: the rows the data plane serves (a test may add its own)."""
        self.settings = settings
        self._runtime = runtime
        self._endpoints = tuple(endpoints)
        self._admin = admin
        self._admin_runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None
        self.plane: DataPlane | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.server.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.admin.port}"

    @property
    def runtime(self) -> Runtime:
        assert self.plane is not None
        return self.plane.runtime

    @property
    def l1(self) -> ResponseTier:
        """The fastest answer tier (L1)."""
        first = self.runtime.tiers.first
        assert first is not None, "this configuration has no answer tier"
        return first

    @property
    def semantic(self) -> SemanticCacheTier:
        """The registered L2 tier (its index, model and warm-up task)."""
        tier = self.runtime.tiers.find(SemanticCacheTier)
        assert tier is not None, "this configuration has no semantic tier"
        return tier

    @property
    def demoter(self) -> Demoter:
        """The cold tier's write-behind queue."""
        tier = self.runtime.tiers.find(ColdTier)
        assert tier is not None, "this configuration has no cold tier"
        return tier.demoter

    def stage(self, kind: type[T], pipeline: str = "chat") -> T:
        """The stage of type ``kind`` in one of the proxy's pipelines (``chat``, ``embeddings``...)."""
        assert self.plane is not None
        return next(stage for stage in self.plane.pipelines.by_route()[pipeline].stages if isinstance(stage, kind))

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the proxy's loop from a test (e.g. inspect a tier)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _start(self) -> None:
        self.plane = DataPlane(self.settings, self._runtime, self._endpoints)
        await self.plane.runtime.start()
        self._server = create_server(self.plane)
        await self._server.start("127.0.0.1", self.settings.server.port)
        if self._admin:
            from admin.app import create_admin_app

            self._admin_runner = web.AppRunner(create_admin_app(self.plane.runtime), access_log=None,
                                               shutdown_timeout=2.0)
            await self._admin_runner.setup()
            await web.TCPSite(self._admin_runner, "127.0.0.1", self.settings.admin.port).start()

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy-under-test", daemon=True)
        self._thread.start()
        self.call(self._start())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._admin_runner is not None:
            self.call(self._admin_runner.cleanup())
        if self._server is not None:
            self.call(self._server.shutdown(2.0))
        if self.plane is not None:
            self.call(self.plane.runtime.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()


class ProxyProcess:
    """``ragproxy serve`` as a child process, configured through the environment; ``open_files``: its
    ``(soft, hard)`` limit on open files."""

    def __init__(self, settings_env: dict[str, str], port: int | None = None, cwd: Path | None = None,
                 open_files: tuple[int, int] | None = None) -> None:
        self.port = port or free_port()
        self.env = {**os.environ, **settings_env, "RAGPROXY_SERVER__PORT": str(self.port),
                    "RAGPROXY_LOGGING__FORMAT": "text"}
        self.env.setdefault("RAGPROXY_ADMIN__PORT", str(free_port()))
        self.env.setdefault("RAGPROXY_DATA_DIR", tempfile.mkdtemp(prefix="ragproxy-test-"))
        self.cwd = cwd
        self.open_files = open_files
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        limits = self.open_files

        def limit_open_files() -> None:
            if limits is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)

        self.process = subprocess.Popen(
            [sys.executable, "-m", "commands.cli", "serve"], env=self.env, cwd=self.cwd,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit_open_files,
        )
        wait_for_port(self.port, timeout=30)
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def output(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout.read().decode(errors="replace")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
