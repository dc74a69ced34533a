"""Slow and idle clients against a ``ragproxy serve`` process with a small open-file limit.

Slowloris, scaled down: the proxy may open 256 files; 300 connections each trickle a request head one byte a second.
``/healthz`` must answer throughout, and no trickled head may hold its connection past the head timeout (10 s by
default). Raw sockets on loopback; the proxy is a real process, so the descriptor limit is its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import refused_port
from tests.support.proxy_server import ProxyProcess
from upstream_doubles.llm_server import FakeLLM

HEAD_TIMEOUT_S = 10.0  # the default of server.head_timeout_s
ENV = {"RAGPROXY_ADMIN__ENABLED": "false", "RAGPROXY_CACHE__ENABLED": "false"}


def _proxy(llm_url: str, open_files: tuple[int, int], **env: str) -> ProxyProcess:
    return ProxyProcess({**ENV, "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]), **env},
                        open_files=open_files)


@pytest.fixture
def slowloris_target() -> Iterator[ProxyProcess]:
    with _proxy(f"http://127.0.0.1:{refused_port()}", (256, 256)) as proxy:
        yield proxy


async def _trickle(port: int, lifetimes: list[float], until: float) -> None:
    """Open a connection and send a request head one byte a second; note how long the server kept it."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        lifetimes.append(0.0)
        return
    try:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        while loop.time() < until:
            writer.write(b"x")
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(1024), 1.0)  # an answer (408) or the close: cut off
                break
            except TimeoutError:
                continue
    except OSError:
        pass
    finally:
        lifetimes.append(loop.time() - started)
        writer.close()


PROBE_TIMEOUT_S = 4.0  # well under the head timeout, after which a starved probe would get through anyway


async def _probe(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), PROBE_TIMEOUT_S)
        return answer.startswith(b"HTTP/1.1 200")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


async def _attack(port: int) -> tuple[list[bool], list[float]]:
    """300 trickled heads for a little longer than the head timeout, and a health probe every 0.3 s meanwhile."""
    loop = asyncio.get_running_loop()
    until = loop.time() + HEAD_TIMEOUT_S + 3
    lifetimes: list[float] = []
    attack = [asyncio.create_task(_trickle(port, lifetimes, until)) for _ in range(300)]
    probes: list[bool] = []
    while loop.time() < until:
        probes.append(await _probe(port))
        await asyncio.sleep(0.3)
    await asyncio.gather(*attack)
    return probes, lifetimes


async def test_healthz_answers_through_a_slowloris_attack_and_trickled_heads_are_cut(
        slowloris_target: ProxyProcess) -> None:
    probes, lifetimes = await _attack(slowloris_target.port)
    assert probes.count(False) == 0, f"{probes.count(False)} of {len(probes)} health probes failed"
    assert max(lifetimes) < HEAD_TIMEOUT_S + 1.5, "a trickled head held its connection past the head timeout"


async def test_the_connection_cap_follows_a_limit_lowered_while_running() -> None:
    """The open-file limit of a running proxy can be lowered from outside (``prlimit``, a container runtime): the
    cap follows it, so the attack still cannot take the descriptors the health check needs."""
    with _proxy(f"http://127.0.0.1:{refused_port()}", (4096, 4096)) as proxy:
        assert proxy.process is not None
        resource.prlimit(proxy.process.pid, resource.RLIMIT_NOFILE, (256, 256))
        probes, _ = await _attack(proxy.port)
    assert probes.count(False) == 0, f"{probes.count(False)} of {len(probes)} health probes failed"


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    with _proxy(f"http://127.0.0.1:{refused_port()}", (128, 4096)) as proxy:
        assert proxy.process is not None
        limits = Path(f"/proc/{proxy.process.pid}/limits").read_text()
        soft, hard = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits).groups()  # type: ignore[union-attr]
        assert (int(soft), int(hard)) == (4096, 4096)


def test_running_out_of_descriptors_does_not_mark_a_healthy_backend_down(fake_llm_thread: FakeLLM) -> None:
    """45 slow requests need 45 client and 45 upstream descriptors; the proxy may open 64 files in all. Those that
    find none get a 503 of the proxy's own; the replica is not blamed, and the next request is served."""
    fake_llm_thread.latency_s = 1.0
    env = {"RAGPROXY_UPSTREAMS__HEALTH_INTERVAL_S": "60"}
    with _proxy(fake_llm_thread.url, (64, 64), **env) as proxy:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        async def burst() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=45)
            async with httpx.AsyncClient(base_url=proxy.url, timeout=15, limits=limits) as client:
                return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(45)))

        answers = asyncio.run(burst())
        statuses = sorted(response.status_code for response in answers)
        assert set(statuses) <= {200, 503} and 503 in statuses, statuses
        assert {r.json()["error"]["code"] for r in answers if r.status_code == 503} == {"proxy_overloaded"}
        fake_llm_thread.latency_s = 0.0
        started = time.monotonic()
        after = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=15)
        assert after.status_code == 200, after.text
        assert time.monotonic() - started < 2
        assert httpx.get(proxy.url + "/readyz").json()["checks"]["llm"] == "ok"
        proxy.stop()
        assert "marked down" not in proxy.output()
