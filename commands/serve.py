"""Running the proxy: the data-plane site, the admin site next to it, graceful drain on SIGTERM/SIGINT.

:func:`running` starts the runtime and both sites and always stops and closes everything again, also when a port
cannot be bound (:class:`CannotListen`: one line for the CLI, no half-started process and no unclosed sessions).
It first takes the data directory's lock (``<data_dir>/ragproxy.lock``, an ``flock`` the kernel releases when the
process ends, however it ends): two processes sharing one directory would corrupt each other's embedded stores (the
cold tier's dictionaries, the semantic index file, credits), so a second one stops with :class:`DataDirInUse`.
:func:`serve` adds the start-up summary (:mod:`proxy.assembly.startup_report`) and waits for a signal. The settings were
checked before (:func:`commands.cli.checked_settings`: what ``check-config`` refuses, ``serve`` refuses).

Once both sites listen, everything allocated so far (modules, settings, the runtime's components: a few hundred
thousand objects) is moved out of the cyclic garbage collector's reach with :func:`gc.freeze`. Under load, objects
of requests in flight survive the young collections and trigger full ones; without the freeze each full
collection walks that whole start-up heap again: without the freeze, pass-through throughput at 64 concurrent
requests was about a quarter lower (``python -m loadtest.bench overhead``; BENCHMARKS.md). Reference counting still
frees frozen objects that are released later; only reference cycles among them would stay.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import os
import resource
import signal
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from aiohttp import web

from proxy.assembly.app import DataPlane, create_server
from proxy.assembly.config import Settings
from proxy.assembly.runtime import Runtime
from proxy.assembly.startup_report import announce, gather, http_url

log = logging.getLogger("ragproxy")


class CannotListen(Exception):
    """An address of the settings cannot be bound (in use, not permitted, not an address of this machine)."""


class DataDirInUse(Exception):
    """Another process holds the data directory's lock."""


@contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold ``<data_dir>/ragproxy.lock`` (created with the directory) for the life of the block; our pid in it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "ragproxy.lock"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise DataDirInUse(f"data directory {str(data_dir)!r} is in use by another ragproxy (pid {holder}); "
                               "give each process its own --data-dir (data_dir)") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


async def _listen(start: Awaitable[None], host: str, port: int, key: str) -> None:
    try:
        await start
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise CannotListen(f"cannot listen on {http_url(host, port)} ({key}): {reason}") from None


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Runtime]:
    """The runtime started and both sites listening; on exit, drain in-flight requests and close everything."""
    with data_dir_lock(settings.data_dir):
        async with _serving(settings) as runtime:
            yield runtime


@asynccontextmanager
async def _serving(settings: Settings) -> AsyncIterator[Runtime]:
    raise_open_file_limit()
    plane = DataPlane(settings)
    runtime = plane.runtime
    server = create_server(plane)
    admin_runner: web.AppRunner | None = None
    try:
        await runtime.start()
        await _listen(server.start(settings.server.host, settings.server.port),
                      settings.server.host, settings.server.port, "server.port")
        if settings.admin.enabled:
            from admin.app import create_admin_app

            admin_runner = web.AppRunner(create_admin_app(runtime), handle_signals=False, access_log=None)
            await admin_runner.setup()
            site = web.TCPSite(admin_runner, settings.admin.host, settings.admin.port, reuse_address=True)
            await _listen(site.start(), settings.admin.host, settings.admin.port, "admin.port")
        yield runtime
    finally:
        runtime.draining = True
        if admin_runner is not None:
            await admin_runner.cleanup()
        await server.shutdown(settings.server.shutdown_grace_s)
        await runtime.stop()


def stop_signal() -> asyncio.Event:
    """An event set at the first SIGTERM or SIGINT (from now on, instead of their default actions)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT, then stop accepting and drain in-flight requests up to the grace period."""
    stop = stop_signal()  # before the port opens: whoever sees it listening may signal at once
    async with running(settings) as runtime:
        announce(await gather(settings, runtime), settings.logging.format)
        gc.freeze()  # see the module docstring
        await stop.wait()
        log.info("draining (up to %.0fs)", settings.server.shutdown_grace_s)
    log.info("stopped")


def raise_open_file_limit() -> None:
    """Lift the soft limit on open files to the hard one: every client and upstream connection holds a descriptor
    (the server caps its connections below the limit in force, :mod:`proxy.server.connection`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the system does not accept
            log.warning("open-file limit left at %d: %s", soft, exc)
