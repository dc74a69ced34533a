"""Running the proxy: the data-plane site, the admin site next to it, graceful drain on SIGTERM/SIGINT.

With ``admin.enabled`` the admin API listens on ``admin.host:admin.port``; the process refuses to start (exit code 2,
one line on stderr) when that bind is not loopback and no ``admin.token`` is set.

Once both sites listen, everything allocated so far (modules, settings, the runtime's components: a few hundred
thousand objects) is moved out of the cyclic garbage collector's reach with :func:`gc.freeze`. Under load, objects
of requests in flight survive the young collections and trigger full ones; without the freeze each full
collection walks that whole start-up heap again: without the freeze, pass-through throughput at 64 concurrent
requests was about a quarter lower (``python -m loadtest.bench overhead``; BENCHMARKS.md). Reference counting still
frees frozen objects that are released later; only reference cycles among them would stay.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from aiohttp import web

from proxy.app import DataPlane, create_server
from proxy.config import Settings

log = logging.getLogger("ragproxy")


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then stop accepting and drain in-flight requests up to the grace period."""
    from admin.auth import bind_problem

    problem = bind_problem(settings)
    if problem is not None:
        print(f"ragproxy: refusing to start: {problem}", file=sys.stderr)
        raise SystemExit(2)
    plane = DataPlane(settings)
    runtime = plane.runtime
    await runtime.start()
    server = create_server(plane)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start(settings.server.host, settings.server.port)
    log.info("ragproxy listening on http://%s:%d", settings.server.host, settings.server.port)
    admin_runner: web.AppRunner | None = None
    if settings.admin.enabled:
        from admin.app import create_admin_app

        admin_runner = web.AppRunner(create_admin_app(runtime), handle_signals=False, access_log=None)
        await admin_runner.setup()
        await web.TCPSite(admin_runner, settings.admin.host, settings.admin.port, reuse_address=True).start()
        log.info("admin API on http://%s:%d", settings.admin.host, settings.admin.port)
    gc.freeze()  # see the module docstring
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("draining (up to %.0fs)", settings.server.shutdown_grace_s)
    runtime.draining = True
    if admin_runner is not None:
        await admin_runner.cleanup()
    await server.shutdown(settings.server.shutdown_grace_s)
    await runtime.stop()
    log.info("stopped")
