"""Common life cycle of the upstream doubles: an aiohttp app on a loopback port, logged, started three ways.

- in-process, on the test's event loop: ``async with FakeLLM() as llm: ...``;
- in a background thread with its own loop, for sync tests and sync SDK clients: ``with FakeLLM() as llm:
  ...``;
- as a process: each double's ``main()`` (``python -m upstream_doubles.llm_server --port P``).

Port 0 (the default) binds a free port; ``url`` reports the real one. A listening socket bound beforehand
(``sock``) is served instead, for a caller that needs the address before the server starts (``ragproxy demo``
builds the proxy's settings first). Every request is appended to ``log`` (:class:`RequestLog`) before the handler
runs, so a request that hangs or fails is still counted; the status it was answered with is recorded once its handler
returns (:meth:`RequestLog.status`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

from aiohttp import web

from proxy.core.loopback import LOOPBACK
from upstream_doubles.request_log import LoggedRequest, RequestLog, frozen_headers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ServedApp:
    """Base class: subclasses add routes in :meth:`add_routes`."""

    def __init__(self, *, host: str = LOOPBACK, port: int = 0, sock: socket.socket | None = None) -> None:
        if sock is not None:
            host, port = sock.getsockname()[:2]
        self.host = host
        self.port = port
        self.sock = sock
        self.log = RequestLog()
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- to override -----------------------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    # -- addresses -------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://host:port`` of the running server (no trailing slash)."""
        if self._runner is None:
            raise RuntimeError("server is not running")
        return f"http://{self.host}:{self.port}"

    # -- in-process ------------------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._log_middleware], client_max_size=256 * 1024 * 1024)
        self.add_routes(app)
        return app

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        runner = web.AppRunner(
            self.build_app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await runner.setup()
        site = web.SockSite(runner, self.sock) if self.sock is not None else \
            web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def wait_stopping(self) -> None:
        """Return when the server is shutting down (handlers that hang wait on this)."""
        assert self._stopping is not None
        await self._stopping.wait()

    # -- background thread -----------------------------------------------------------------------------------
    def start_in_thread(self) -> Self:
        """Run the server on its own event loop in a daemon thread; returns once it listens."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.start())
            except BaseException as error:  # reported to the starting thread
                errors.append(error)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"{type(self).__name__}-server", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop_thread(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop = self._loop
        if self._stopping is not None:
            loop.call_soon_threadsafe(self._stopping.set)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_thread()

    # -- as a process ----------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until SIGTERM/SIGINT (used by each double's ``main``)."""

        async def run() -> None:
            done = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):  # before the banner: whoever reads it may signal at once
                loop.add_signal_handler(sig, done.set)
            await self.start()
            print(f"{type(self).__name__} listening on {self.url}", flush=True)
            await done.wait()
            await self.stop()

        asyncio.run(run())

    # -- logging ---------------------------------------------------------------------------------------------
    @web.middleware
    async def _log_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        body = await request.read()
        entry = LoggedRequest(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=frozen_headers(request.headers),
            body=body,
            received_at=time.monotonic(),
        )
        self.log.append(entry)
        try:
            response = await handler(request)
        except web.HTTPException as refused:  # aiohttp's own answers: no route, wrong method
            self.log.answered(entry, refused.status)
            raise
        self.log.answered(entry, response.status)
        return response
