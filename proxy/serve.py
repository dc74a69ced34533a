"""Running the proxy: the data-plane site, graceful drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from proxy.app import RUNTIME, create_app
from proxy.config import Settings

log = logging.getLogger("ragproxy")


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then stop accepting and drain in-flight requests up to the grace period."""
    app = create_app(settings)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, handler_cancellation=True,
        shutdown_timeout=settings.server.shutdown_grace_s,
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    site = web.TCPSite(runner, settings.server.host, settings.server.port, reuse_address=True)
    await site.start()
    log.info("ragproxy listening on http://%s:%d", settings.server.host, settings.server.port)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("draining (up to %.0fs)", settings.server.shutdown_grace_s)
    app[RUNTIME].draining = True
    await runner.cleanup()
    log.info("stopped")
