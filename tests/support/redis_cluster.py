"""A real Redis Cluster for tests: 3 masters (optionally one replica each) of ``redis-server --cluster-enabled``
on free loopback ports, joined with ``redis-cli --cluster create``.

Ports are at most 55535 because every node also listens on its cluster bus port, ``port + 10000``.
``node_timeout_ms`` is short (1 s) so that a killed master is failed over within a few seconds.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import redis
from redis.crc import key_slot

from tests.support.processes import RedisServer, free_port


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def cluster_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


@dataclass
class RedisClusterProcesses:
    """The cluster's nodes; ``url`` is a ``redis+cluster://`` URL of the first master."""

    masters: int = 3
    replicas_per_master: int = 0
    node_timeout_ms: int = 1000
    servers: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}/0"

    @property
    def plain_url(self) -> str:
        """The same node as a plain ``redis://`` URL (for settings that carry ``redis.cluster=true``)."""
        return f"redis://127.0.0.1:{self.servers[0].port}/0"

    def start(self, timeout: float = 30.0) -> Self:
        count = self.masters * (1 + self.replicas_per_master)
        for _ in range(count):
            self.servers.append(RedisServer.start(
                cluster_port(), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms)))
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
             "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
        )
        self.wait_healthy(timeout)
        return self

    def _client(self, server: RedisServer) -> redis.Redis:
        return redis.Redis(port=server.port, socket_timeout=1.0, socket_connect_timeout=1.0)

    def live(self) -> list[RedisServer]:
        return [s for s in self.servers if s.process.poll() is None]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node reports ``cluster_state:ok`` and every slot is served by a live master (and,
        with replicas, each master has a connected replica)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._healthy():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the Redis Cluster did not become healthy")

    def _healthy(self) -> bool:
        live = self.live()
        for server in live:
            with self._client(server) as client:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
        with self._client(live[0]) as client:
            nodes = client.cluster("nodes")
        masters = [n for n in nodes.values() if "master" in n["flags"] and "fail" not in n["flags"]
                   and n["connected"] and n["slots"]]
        if len(masters) != self.masters:
            return False
        if self.replicas_per_master and len(live) == len(self.servers):
            replicas = [n for n in nodes.values() if "slave" in n["flags"] and n["connected"]]
            return len(replicas) == self.masters * self.replicas_per_master
        return True

    def master_for(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot as master (as the first reachable live node sees it)."""
        slot = key_slot(key.encode())
        for server in self.live():
            try:
                with self._client(server) as client:
                    shards = client.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            for start, end, master, *_ in shards:
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(s for s in self.servers if s.port == port)
        raise LookupError(f"no master for slot {slot}")

    def kill(self, server: RedisServer) -> None:
        """SIGKILL one node (a crash, not a shutdown)."""
        server.process.kill()
        server.process.wait()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
