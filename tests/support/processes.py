"""Real peer processes for tests: a redis-server on a free loopback port (free-port helpers from loadtest)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from loadtest.harness import free_port, wait_for_port

_REFUSING: list[socket.socket] = []


def refused_port() -> int:
    """A loopback port that refuses every connection for the rest of the session: bound, never listening, so no
    other process can take it and answer (a port merely free now may be some other test's server a moment later)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    _REFUSING.append(held)
    return int(held.getsockname()[1])

VOLATILE = ("--appendonly", "no")
"""Options of a redis-server that keeps nothing across a restart (the proxy refuses credits in it)."""


@dataclass
class RedisServer:
    """A redis-server process owned by the test session (never the machine's shared one on 6379), persistent as
    the proxy needs it for credits (an append-only file, fsync every second, in its own directory: it survives
    :meth:`restart`); ``extra`` options after the defaults (:data:`VOLATILE` for one that keeps nothing)."""

    port: int
    process: subprocess.Popen[bytes]
    directory: Path
    extra: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, port: int | None = None, *extra: str, directory: Path | None = None) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = port or free_port()
        directory = directory or Path(tempfile.mkdtemp(prefix="ragproxy-redis-"))
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "everysec", "--dir", str(directory), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(port)
        return cls(port=port, process=process, directory=directory, extra=extra)

    def _end(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Stop the server (SIGTERM) and start it again on the same port and directory, with the same options."""
        self._end()
        self.process = RedisServer.start(self.port, *self.extra, directory=self.directory).process

    def stop(self) -> None:
        self._end()
        shutil.rmtree(self.directory, ignore_errors=True)
